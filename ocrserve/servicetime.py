"""A page's seconds in the engine as a function of its cost, learned from the pages that finish;
admission estimates how long the work ahead of a request will take from it.

Pages differ, but not in proportion to their cost: every page pays a fixed part (its crops, its
transfers, the engine's work per request) besides the part that grows with its pixels or visual
tokens. Measured on the embedded engine (2 cores, 2026-12-01): a 640 x 200 page (128 k tokens)
took 0.3 s, a 1545 x 2000 page (3.1 M tokens, 24 times more) about 2 s, 6.7 times more. So the
model is a power law, ``seconds = c x cost ** k``, fitted by exponentially weighted least squares
on logarithms over recent pages (the newest weighs :data:`FIT_WEIGHT`), ``k`` kept within [0, 1].
While recent pages are all alike, nothing says how time grows with cost, and ``k`` is
:data:`PRIOR_EXPONENT`, halfway between "every page alike" (0) and "in proportion to cost" (1):
a first large scan after small pages is then neither waved through nor refused outright, and
the fit takes over once it has finished.

Admission does not trust the mean alone (:meth:`ServiceTime.upper_factor`): each finished page's
seconds over what the model predicted for it before it finished are kept (the last
:data:`RATIOS_KEPT`), and estimates are multiplied by their :data:`UPPER_QUANTILE` quantile, by at
least :data:`PRIOR_FACTOR` until :data:`ENOUGH_PAGES` pages have been seen: wide while the model
knows little, tightening as evidence comes, and widening again when recent pages run slower than
predicted (a busy machine, pages of a kind it has not seen).
"""

from __future__ import annotations

import math
from collections import deque

#: Weight of the newest page in the fit (about the last 1 / FIT_WEIGHT pages count).
FIT_WEIGHT = 0.05
#: The exponent while recent pages' costs are alike (module docstring; the measured one was 0.6).
PRIOR_EXPONENT = 0.5
#: Below this spread of recent log-costs (their standard deviation) the pages count as alike.
ALIKE = 0.1
#: Ratios of actual to predicted seconds kept for :meth:`ServiceTime.upper_factor`.
RATIOS_KEPT = 64
#: The quantile of those ratios admission multiplies its estimates by.
UPPER_QUANTILE = 0.9
#: Pages to see before the ratios alone set the factor (the 0.9 quantile of fewer is one of the
#: largest few, which says little).
ENOUGH_PAGES = 16
#: The factor until then: the service-time model of a fresh gateway was off by up to 2x on pages
#: unlike its calibration pages (a dense scan against the letter page).
PRIOR_FACTOR = 2.0


class ServiceTime:
    """``seconds = c x cost ** k`` for a page in the engine (module docstring).

    Args:
        initial_s: a page's seconds until one has been measured (``router.initial_page_s``).
    """

    def __init__(self, initial_s: float):
        self.initial_s = initial_s
        self.measured = 0
        self._sums = [0.0] * 5  # weights, x, y, x^2, x y of x = log cost, y = log seconds
        self.ratios: deque[float] = deque(maxlen=RATIOS_KEPT)  # actual / predicted seconds, newest last

    def record(self, cost: float, seconds: float) -> None:
        """A page of ``cost`` (at least 1) took ``seconds`` in the engine."""
        self.ratios.append(seconds / self.page_s(cost))
        x, y = math.log(max(cost, 1.0)), math.log(max(seconds, 1e-6))
        keep = 1 - FIT_WEIGHT if self.measured else 0.0
        for i, value in enumerate((1.0, x, y, x * x, x * y)):
            self._sums[i] = keep * self._sums[i] + value
        self.measured += 1

    @property
    def exponent(self) -> float:
        """``k``: how a page's seconds grow with its cost (:data:`PRIOR_EXPONENT` while pages are alike)."""
        w, sx, sy, sxx, sxy = self._sums
        if not self.measured:
            return PRIOR_EXPONENT
        mean_x = sx / w
        variance = sxx / w - mean_x * mean_x
        if variance <= ALIKE * ALIKE:
            return PRIOR_EXPONENT
        return min(1.0, max(0.0, (sxy / w - mean_x * sy / w) / variance))

    def page_s(self, cost: float) -> float:
        """Seconds of one page of ``cost``; :attr:`initial_s` before any page has been measured."""
        if not self.measured:
            return self.initial_s
        w, sx, sy, _, _ = self._sums
        k = self.exponent
        return math.exp(sy / w - k * sx / w) * max(cost, 1.0) ** k

    def seconds(self, pages: int, cost: float) -> float:
        """Seconds of engine work for ``pages`` pages costing ``cost`` in all, taking each at their
        mean cost (which, ``k`` being at most 1, can only overstate the work of unequal pages)."""
        return pages * self.page_s(cost / pages) if pages else 0.0

    def upper_factor(self) -> float:
        """What admission multiplies an estimate by (module docstring): the :data:`UPPER_QUANTILE`
        quantile (nearest rank) of the recent actual / predicted ratios, at least 1, and at least
        :data:`PRIOR_FACTOR` while fewer than :data:`ENOUGH_PAGES` pages were seen."""
        ranked = sorted(self.ratios)
        quantile = ranked[max(0, math.ceil(UPPER_QUANTILE * len(ranked)) - 1)] if ranked else 1.0
        floor = PRIOR_FACTOR if len(ranked) < ENOUGH_PAGES else 1.0
        return max(1.0, floor, quantile)
