"""The admission's model of a page's seconds in the engine, on figures with known answers."""

from __future__ import annotations

import pytest

from ocrserve.servicetime import ENOUGH_PAGES, PRIOR_EXPONENT, PRIOR_FACTOR, ServiceTime


def test_a_power_law_page_time_is_recovered_from_pages_of_different_sizes():
    """``seconds = 0.002 x tokens ** 0.6`` (2.3 s for 128 k tokens, 15 s for 3 M): c and k come back."""
    model = ServiceTime(initial_s=1.0)
    for cost in [128_000, 3_000_000, 500_000, 1_500_000] * 10:
        model.record(cost, 0.002 * cost**0.6)
    assert model.exponent == pytest.approx(0.6)
    assert model.page_s(3_000_000) == pytest.approx(0.002 * 3_000_000**0.6)
    assert model.seconds(10, 10 * 3_000_000) == pytest.approx(10 * 0.002 * 3_000_000**0.6)
    assert model.seconds(0, 0) == 0.0


def test_before_any_page_and_while_pages_are_alike():
    model = ServiceTime(initial_s=2.0)
    assert model.seconds(3, 999) == 6.0  # nothing measured: router.initial_page_s a page
    for _ in range(5):
        model.record(128_000, 0.3)  # small pages only
    assert model.exponent == PRIOR_EXPONENT and model.page_s(128_000) == pytest.approx(0.3)
    # a 24 times larger scan: sqrt(24) = 4.9 times the small page, neither 1 nor 24 times
    assert model.page_s(24 * 128_000) == pytest.approx(0.3 * 24**0.5)


def test_the_exponent_stays_within_zero_and_one():
    model = ServiceTime(initial_s=1.0)
    for cost, seconds in [(100, 0.01), (10_000, 10.0)]:  # k = 1.5 by these two
        model.record(cost, seconds)
    assert model.exponent == 1.0
    inverse = ServiceTime(initial_s=1.0)
    for cost, seconds in [(100, 1.0), (10_000, 0.5)]:  # larger pages faster: noise
        inverse.record(cost, seconds)
    assert inverse.exponent == 0.0


def test_admission_bound_is_wide_while_little_is_known_and_follows_over_runs():
    """The factor admission multiplies its estimates by: 2 until 16 pages were seen, then the 0.9
    quantile of how far pages ran over their prediction; pages slower than predicted widen it."""
    model = ServiceTime(initial_s=1.0)
    assert model.upper_factor() == PRIOR_FACTOR == 2.0
    for _ in range(ENOUGH_PAGES):
        model.record(1000, 0.5)  # every page as predicted once the fit has one
    assert model.ratios[0] == 0.5  # the first against the prior of 1 s
    assert model.upper_factor() == pytest.approx(1.0)
    for _ in range(8):  # a busy machine: pages now take three times their prediction
        model.record(1000, 3 * model.page_s(1000))
    assert model.upper_factor() == pytest.approx(3.0)
