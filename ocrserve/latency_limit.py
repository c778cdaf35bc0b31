"""How many pages the router keeps in the engine: a fixed number, or one that follows latency.

:class:`LatencyLimit` is additive-increase, multiplicative-decrease on each page's seconds in the
engine, after TCP Vegas (Brakmo and Peterson, "TCP Vegas: end to end congestion avoidance on a
global Internet", IEEE JSAC 1995) and Netflix's concurrency-limits (``VegasLimit``,
``AIMDLimit``): a page that took about its no-queueing time says the engine has room, so the limit
grows by one per limit's worth of such pages (one more page in flight per "round trip"); a page
that took much longer says pages queue inside the engine, so the limit shrinks by a factor. The
no-queueing time is the fastest page among the last :data:`FLOOR_WINDOW`. Within ``[1,
maximum]``, the maximum being the engine's planned slots x overcommit: big batches while the
engine keeps up, small ones when its latency climbs.
"""

from __future__ import annotations

from collections import deque

FLOOR_WINDOW = 200
"""Pages the no-queueing time is the fastest of (older ones age out, so a slower engine or heavier
pages move the floor too)."""
TOLERANCE = 2.0
"""A page within this multiple of the floor counts as unqueued (Vegas' alpha/beta band, as a ratio)."""
BACKOFF = 0.9
"""The factor the limit shrinks by after a queued page (``AIMDLimit``'s default backoff ratio)."""


class LatencyLimit:
    """An in-flight limit that follows the engine's latency (see the module docstring).

    Args:
        maximum: the most pages in flight (the engine's slots x ``router.slot_overcommit``).
        initial: the starting limit (default: ``maximum``).

    Attributes:
        value: the current limit, a float; :attr:`limit` is its whole part, at least 1.
    """

    def __init__(self, maximum: int, initial: float | None = None):
        self.maximum = max(1, maximum)
        self.value = float(min(self.maximum, initial or self.maximum))
        self._recent: deque[float] = deque(maxlen=FLOOR_WINDOW)

    @property
    def limit(self) -> int:
        """Pages the router may keep in the engine now."""
        return max(1, int(self.value))

    def record(self, seconds: float) -> None:
        """One page's seconds in the engine (cancelled pages are not recorded)."""
        self._recent.append(seconds)
        if seconds <= TOLERANCE * min(self._recent):
            self.value = min(self.maximum, self.value + 1 / self.value)
        else:
            self.value = max(1.0, self.value * BACKOFF)
