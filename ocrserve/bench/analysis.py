"""What a sweep's points say: the knee of the throughput curve, and the setting to recommend for a
latency target.

A point is one measured setting (a concurrency, an arrival rate, or a server-side value such as
``vllm.max_num_seqs``) with its throughput in pages/s and its p95 end-to-end latency in seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: A step that adds less than this fraction of throughput is past the knee (``--knee-gain``).
KNEE_GAIN = 0.05


@dataclass(frozen=True)
class Point:
    """One measured setting of a sweep.

    Attributes:
        value: the swept value (a concurrency, a rate in pages/s, or a setting's value).
        pages_per_s: pages completed per second.
        p95_s: 95th-percentile end-to-end latency of a request, seconds (NaN with no request done).
        setting: the server-side settings it ran under (``KEY=VALUE`` joined by spaces), or ``""``.
    """

    value: float
    pages_per_s: float
    p95_s: float
    setting: str = ""


def knee(points: Sequence[Point], gain: float = KNEE_GAIN) -> Point:
    """The knee of the throughput curve: the first point, in order of ``value``, after which one more
    step adds less than ``gain`` (a fraction: 0.05 = 5%) of its throughput; the last point when every
    step adds more.

    Raises:
        ValueError: no points.
    """
    ordered = sorted(points, key=lambda p: p.value)
    if not ordered:
        raise ValueError("no points to find a knee in")
    for current, following in zip(ordered, ordered[1:], strict=False):
        if following.pages_per_s < current.pages_per_s * (1 + gain):
            return current
    return ordered[-1]


def recommend(points: Sequence[Point], p95_s: float) -> Point | None:
    """The setting with the highest throughput whose p95 meets ``p95_s`` seconds (goodput), the
    smaller value on a tie; None when no point meets it."""
    meeting = [p for p in points if p.p95_s <= p95_s]
    if not meeting:
        return None
    return max(meeting, key=lambda p: (p.pages_per_s, -p.value))


def curves(points: Iterable[T], setting: Callable[[T], str], value: Callable[[T], float]) -> dict[str, list[T]]:
    """A sweep's points by curve, each ordered by value. A point's settings are ``KEY=VALUE`` joined
    by spaces, the swept key first; its curve is the rest (``""``: the only curve of a concurrency
    sweep or of a one-key server-side sweep). ``setting`` and ``value`` read them off a point."""
    by_curve: dict[str, list[T]] = {}
    for point in sorted(points, key=value):
        by_curve.setdefault(setting(point).partition(" ")[2], []).append(point)
    return by_curve
