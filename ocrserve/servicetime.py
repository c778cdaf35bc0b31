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
"""

from __future__ import annotations

import math

#: Weight of the newest page in the fit (about the last 1 / FIT_WEIGHT pages count).
FIT_WEIGHT = 0.05
#: The exponent while recent pages' costs are alike (module docstring; the measured one was 0.6).
PRIOR_EXPONENT = 0.5
#: Below this spread of recent log-costs (their standard deviation) the pages count as alike.
ALIKE = 0.1


class ServiceTime:
    """``seconds = c x cost ** k`` for a page in the engine (module docstring).

    Args:
        initial_s: a page's seconds until one has been measured (``router.initial_page_s``).
    """

    def __init__(self, initial_s: float):
        self.initial_s = initial_s
        self.measured = 0
        self._sums = [0.0] * 5  # weights, x, y, x^2, x y of x = log cost, y = log seconds

    def record(self, cost: float, seconds: float) -> None:
        """A page of ``cost`` (at least 1) took ``seconds`` in the engine."""
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
