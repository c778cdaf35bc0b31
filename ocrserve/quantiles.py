"""The nearest-rank quantile, the one the project's latencies, over-runs and percentiles use."""

from __future__ import annotations

import math
from collections.abc import Sequence


def nearest_rank(ranked: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 < ``q`` <= 1) of ``ranked`` (sorted ascending, not empty) by the
    nearest-rank method: its ``ceil(q x n)``-th value (Hyndman and Fan 1996, definition 1), so
    always one of the values, never an interpolation between two.

    Raises:
        IndexError: ``ranked`` is empty.
    """
    return ranked[max(0, math.ceil(q * len(ranked)) - 1)]
