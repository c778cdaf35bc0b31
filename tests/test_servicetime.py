"""The admission's model of a page's seconds in the engine, on figures with known answers."""

from __future__ import annotations

import math

import pytest

from ocrserve.quantiles import pseudo_median
from ocrserve.router import BusyWindow
from ocrserve.servicetime import (
    ENOUGH_PAGES,
    FIT_PAGES,
    UNSEEN_FACTOR,
    ServiceTime,
    ShareClock,
    Work,
)


def page(megapixels: float, kilo_units: float) -> Work:
    return Work(1, megapixels * 1e6, kilo_units * 1e3)


def test_a_linear_page_time_is_recovered_from_pages_of_different_pixels_and_text():
    """``seconds = 0.1 + 0.4 x Mpx + 2 x kilo-units``: a sparse letter page (3 Mpx, 30 line units)
    takes 1.36 s, a dense one (3 Mpx, 3,000 units) 7.3 s, a strip the detector magnifies (3.8 Mpx,
    38 units) 1.7 s: pixels alone could not tell the letters apart."""
    model = ServiceTime(initial_s=1.0)
    for work in [page(3, 0.03), page(3, 3), page(3.8, 0.038), page(0.3, 0.24)] * 20:
        model.record(work, 0.1 + 0.4 * work.pixels / 1e6 + 2 * work.units / 1e3)
    assert model.coefficients == pytest.approx((0.1, 0.4, 2.0), abs=0.01)
    assert model.seconds(page(3, 3)) == pytest.approx(7.3, rel=0.01)
    assert model.seconds(page(3, 0.03)) == pytest.approx(1.36, rel=0.02)
    # a request's work is its pages' sum, and so are its seconds
    assert model.seconds(page(3, 3) + page(3, 0.03)) == pytest.approx(7.3 + 1.36, rel=0.01)


def test_before_any_page_every_page_takes_the_initial_seconds():
    model = ServiceTime(initial_s=2.0)
    assert model.coefficients == (2.0, 0.0, 0.0)
    assert model.seconds(Work(3, 9e6, 5e3)) == 6.0  # router.initial_page_s a page
    assert model.seconds(Work()) == 0.0


def test_no_coefficient_goes_negative():
    """Pages with more text that ran faster (noise) would fit a negative price on text: it is
    dropped, and the rest fitted without it."""
    model = ServiceTime(initial_s=1.0)
    for work, seconds in [(page(1, 0.1), 2.0), (page(1, 2.0), 1.5), (page(2, 0.1), 3.0)] * 5:
        model.record(work, seconds)
    a, b, c = model.coefficients
    assert c == 0.0 and a > 0 and b > 0
    assert model.seconds(page(1, 5.0)) == pytest.approx(model.seconds(page(1, 0.0)))


def test_one_page_seen_does_not_leave_the_fit_undefined():
    model = ServiceTime(initial_s=1.0)
    model.record(page(1, 1), 3.0)
    assert model.seconds(page(1, 1)) == pytest.approx(3.0, rel=0.1)


def test_admission_bound_is_wide_while_little_is_known_and_follows_over_runs():
    """The factor admission multiplies its estimates by: 1.5 before any page was measured against a
    fit; then, until 16 pages were seen after the first three (a fit of fewer is underdetermined),
    their centre times ``1 + 0.5 / sqrt(n + 1)``: 1.35 after one, 1.22 after four; then
    the 0.9 quantile of how far pages ran over their prediction; pages slower than predicted widen
    it."""
    model = ServiceTime(initial_s=1.0)
    for _ in range(FIT_PAGES):
        assert model.upper_factor() == UNSEEN_FACTOR == 1.5 and model.warming
        model.record(page(1, 1), 0.5)
    model.record(page(1, 1), 0.5)
    assert model.upper_factor() == pytest.approx(1.35, abs=0.01) and model.warming
    for _ in range(3):
        model.record(page(1, 1), 0.5)
    assert model.upper_factor() == pytest.approx(1.22, abs=0.01) and model.warming
    for _ in range(ENOUGH_PAGES - 4):
        model.record(page(1, 1), 0.5)  # every page as predicted once the fit has one
    assert len(model.ratios) == ENOUGH_PAGES  # none against the prior of 1 s or a fit of fewer pages
    assert model.ratios[0] == pytest.approx(1.0, abs=0.05)
    assert model.upper_factor() == pytest.approx(1.0, abs=0.05) and not model.warming
    for _ in range(8):  # a busy machine: pages now take three times their prediction
        model.record(page(1, 1), 3 * model.seconds(page(1, 1)))
    assert model.upper_factor() >= 2.5


def test_a_machine_slower_than_at_calibration_widens_the_margin_while_few_were_seen():
    """Four pages each 1.5 times their prediction: the margin is their centre times
    ``1 + 0.5 / sqrt(5)``."""
    model = ServiceTime(initial_s=1.0)
    model.ratios.extend([1.5] * 4)
    assert model.warming and model.prior_margin() == pytest.approx(1.5 * (1 + 0.5 / math.sqrt(5)))


def test_one_page_far_over_its_prediction_does_not_set_the_bound_while_few_were_seen():
    """Among the first pages, one that ran 9 times over its prediction (a kind the fit had not seen)
    leaves the factor at the prior's margin: the median of few ratios, not their largest, counts."""
    model = ServiceTime(initial_s=1.0)
    for seconds in [1.0] * FIT_PAGES + [9.0, 1.0, 1.0, 1.0, 1.0]:
        model.record(page(1, 1), seconds)
    assert max(model.ratios) > 5
    assert model.over_run() == pytest.approx(1.0, abs=0.2)
    assert model.upper_factor() == model.prior_margin() < 1.0 + 0.5 / math.sqrt(6) + 0.2


def test_over_runs_of_many_pages_together_narrow_towards_their_centre():
    """Ratios spread 0.8-1.6, pseudo-median 1.1: one page is bound at their 0.9 quantile, 16 pages
    together a quarter of the way from the centre to it (1 / sqrt(16))."""
    model = ServiceTime(initial_s=1.0)
    spread = [0.8, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]
    model.ratios.extend(spread + spread[::-1])  # the newest near 1: the centre is all ratios'
    upper = sorted(model.ratios)[math.ceil(0.9 * 32) - 1]
    assert pseudo_median(model.ratios) == pytest.approx(1.1)
    assert model.over_run() == model.over_run(0.5) == model.upper_factor() == upper == 1.5
    assert model.over_run(16) == pytest.approx(1.1 + (1.5 - 1.1) / 4)
    assert model.upper_factor(4) == pytest.approx(1.3)


def test_the_centre_follows_the_newest_pages_where_they_run_slower():
    """Ten pages as predicted, then six 1.5 times over (a kind the fit has not learned): the centre
    of all sixteen is still near 1.2, the newest eight's 1.5, and the margin is set by theirs; six
    pages faster than predicted after ten as predicted leave the centre at all ratios'."""
    model = ServiceTime(initial_s=1.0)
    model.ratios.extend([1.0] * 10 + [1.5] * 6)
    assert pseudo_median(model.ratios) < 1.3
    assert model.centre() == pytest.approx(1.5) == model.over_run(100)
    faster = ServiceTime(initial_s=1.0)
    faster.ratios.extend([1.0] * 10 + [0.6] * 6)
    assert faster.centre() == pseudo_median(faster.ratios) > 0.6
    assert ServiceTime(initial_s=1.0).centre() == 1.0


def test_ratios_in_two_groups_do_not_flip_the_margin_with_one_page():
    """Two pages in the engine together split its seconds unevenly, so ratios alternate (0.54 and
    1.29, measured on receipts beside a CPU hog): one ratio more moves their median from one group
    to the other (the margin from 1.14 to 1.37 there), their pseudo-median barely."""
    model = ServiceTime(initial_s=1.0)
    model.ratios.extend([0.54, 1.29] * 6)
    assert model.prior_margin() == pytest.approx(1 + 0.5 / math.sqrt(13))
    model.ratios.append(1.29)
    assert sorted(model.ratios)[6] == 1.29  # the median flipped
    assert model.prior_margin() == pytest.approx(1 + 0.5 / math.sqrt(14))  # the centre stayed below 1


def test_the_share_clock_splits_the_engines_seconds_between_the_pages_in_it(monkeypatch):
    """Alone a page's share is its wall seconds; beside three others, a quarter of them."""
    now = [100.0]
    monkeypatch.setattr("ocrserve.servicetime.time.monotonic", lambda: now[0])
    clock = ShareClock()
    alone = clock.enter(interactive=False)
    now[0] += 2.0
    assert clock.leave(alone, interactive=False) == pytest.approx(2.0)
    kinds = [True, False, False, False]
    entered = [clock.enter(kind) for kind in kinds]
    now[0] += 8.0
    shares = [clock.leave(reading, kind) for reading, kind in zip(entered, kinds, strict=True)]
    assert shares == pytest.approx([2.0, 2.0, 2.0, 2.0])  # 8 s shared by four, whatever their class


def test_the_share_clock_gives_background_pages_their_share_beside_interactive_ones(monkeypatch):
    """With ``background_share``, background pages split that share of the seconds an interactive
    page is in the engine beside them, and every second of the rest."""
    now = [100.0]
    monkeypatch.setattr("ocrserve.servicetime.time.monotonic", lambda: now[0])
    clock = ShareClock(background_share=0.1)
    documents = [clock.enter(interactive=False) for _ in range(2)]
    now[0] += 4.0  # two background pages alone: 2 s each
    single = clock.enter(interactive=True)
    now[0] += 10.0  # beside the single page: 0.5 s each, 9 s to it
    assert clock.now() == pytest.approx((9.0 + 4.0 / 2, 2.0 + 0.5))
    assert clock.leave(single, interactive=True) == pytest.approx(9.0)
    now[0] += 1.0
    assert [clock.leave(reading, interactive=False) for reading in documents] == pytest.approx([3.0, 3.0])
    assert clock.pages == 0


def test_a_thread_pre_empting_the_background_pages_takes_a_core_from_them(monkeypatch):
    """With ``background_share``, each thread :meth:`ShareClock.pre_empting` them takes a core of
    the clock's ``cores`` from the background pages while it runs (none of the interactive
    pages'); without it, the clock goes on as before."""
    now = [100.0]
    monkeypatch.setattr("ocrserve.servicetime.time.monotonic", lambda: now[0])
    clock = ShareClock(background_share=0.1, cores=2)
    documents = [clock.enter(interactive=False) for _ in range(2)]
    with clock.pre_empting():
        now[0] += 4.0  # a core of two left to the two pages: 1 s each
        with clock.pre_empting():
            now[0] += 3.0  # none left
        single = clock.enter(interactive=True)
        now[0] += 10.0  # 9 s to the single page; half of 1 s to the pages
        assert clock.leave(single, interactive=True) == pytest.approx(9.0)
    now[0] += 2.0  # no thread beside them: 1 s each
    assert [clock.leave(reading, interactive=False) for reading in documents] == pytest.approx([2.25, 2.25])
    equal = ShareClock(cores=2)
    alone = equal.enter(interactive=False)
    with equal.pre_empting():
        now[0] += 3.0
    assert equal.leave(alone, interactive=False) == pytest.approx(3.0)


def test_the_busy_window_is_the_share_of_recent_time_a_page_of_a_kind_was_in(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("ocrserve.router.time.monotonic", lambda: now[0])
    window = BusyWindow(30.0)
    assert window.fraction() == 0.0
    first, second = window.enter("a"), window.enter("b")  # two at once count once
    now[0] += 6.0
    window.leave(first)
    now[0] += 3.0
    window.leave(second)  # one was in for 9 s: 6 of them a's, all 9 b's
    now[0] += 6.0
    assert window.fraction() == pytest.approx(9 / 30)
    assert window.fraction(excluding="b") == pytest.approx(6 / 30)
    assert window.fraction(excluding="a") == pytest.approx(9 / 30)
    window.enter("a")  # in since 3 s ago, still in
    now[0] += 3.0
    assert window.fraction() == pytest.approx(12 / 30)
    assert window.fraction(excluding="a") == pytest.approx(12 / 30)  # a's page in now: a goes on
    now[0] += 60.0  # the first spans have left the window; the one still in fills it
    assert window.fraction() == 1.0


def test_a_clients_own_pages_leave_the_busy_window_only_when_it_sent_them_one_at_a_time(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("ocrserve.router.time.monotonic", lambda: now[0])
    window = BusyWindow(30.0)
    for _ in range(3):  # a waits for each answer: 2 s in, 1 s out
        token = window.enter("a")
        now[0] += 2.0
        window.leave(token)
        now[0] += 1.0
    assert window.one_at_a_time("a") and window.fraction(excluding="a") == 0.0
    assert window.fraction() == pytest.approx(6 / 30)
    first = window.enter("b")  # b sends its next page before the first is answered
    now[0] += 1.0
    second = window.enter("b")
    now[0] += 1.0
    window.leave(first)
    assert not window.one_at_a_time("b")  # one in now
    now[0] += 1.0
    window.leave(second)
    assert not window.one_at_a_time("b")  # they overlapped
    assert window.fraction(excluding="b") == window.fraction() == pytest.approx(9 / 30)


def test_the_calibration_pages_fit_as_the_engines_stages_run():
    """The three calibration pages as measured on 2 cores (2026-12-05): the strip (1.79 Mpx at the
    detector, 16 line units) in 0.70 s, the full letter page (0.97 Mpx, 803 units) in 2.66 s, the
    letter page of one line (0.97 Mpx, 21 units) in 0.31 s. The fit comes out near the stages'
    own timings (detection 0.3-0.4 s a megapixel, recognition 2.6-2.8 ms a unit, little else), so
    it prices the strip ``ocrmypdf/crom.png`` (3.79 Mpx at the detector, 13 units; 1.48 s) within
    15%, where a fit drawn towards a second a page priced it at 0.92 s."""
    model = ServiceTime(initial_s=1.0)
    for megapixels, units, seconds in [(1.79, 16, 0.70), (0.97, 803, 2.66), (0.97, 21, 0.31)]:
        model.record(page(megapixels, units / 1e3), seconds)
    a, b, c = model.coefficients
    assert a < 0.05 and 0.3 < b < 0.4 and 2.7 < c < 3.0
    assert model.seconds(page(3.79, 0.013)) == pytest.approx(1.48, rel=0.15)
