"""Statistical ``--max-num-seqs``: the most pages at once whose KV cache outgrows vLLM's only rarely.

vLLM keeps a sequence's KV cache in whole blocks of :data:`~ocrserve.gpu.memory.BLOCK_SIZE` tokens
(``vllm/v1/core/kv_cache_manager.py`` ``allocate_slots``: ``ceil(tokens / block_size)`` blocks a
request; ``vllm/v1/core/block_pool.py`` hands them out of one free list). A page of ``prefix``
tokens (visual + prompt) and ``out`` output tokens holds ``ceil((prefix + out) / 16)`` blocks at its
last step (the last sampled token is never fed back, so this is at most one block above vLLM's).

With ``N`` pages at once, each an independent draw from the output-length model, the chance that
they together need more blocks than the cache holds, ``P(B_1 + ... + B_N > C)``, is computed
**exactly**: the distribution of the sum is the ``N``-fold convolution of one page's block
distribution, truncated at ``C`` (mass beyond the cache stays beyond it, blocks being never
negative) and convolved by FFT. It is a conservative bound on vLLM's preemption: it takes every
page at its final length at once, where a running batch holds pages part-way through
(:mod:`ocrserve.gpu.scheduler_model` simulates that). Overflowing costs no page its output:
vLLM preempts the newest running request, frees its blocks and later recomputes its prefill
(``vllm/v1/core/sched/scheduler.py`` ``_preempt_request``: ``num_computed_tokens = 0``, back to
the front of the waiting queue), so ``max_tokens`` stays the full output budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ocrserve.gpu.memory import BLOCK_SIZE

DEFAULT_OVERFLOW_TARGET = 0.01
"""Default chance per admitted batch that ``N`` pages outgrow the cache (``--overflow``)."""
_DIRECT = 4_000_000
"""Above this many multiply-adds a convolution goes through the FFT."""


def page_blocks(prefix_tokens: int, out_tokens: int, block: int = BLOCK_SIZE) -> int:
    """KV blocks one page holds at its last step: ``ceil((prefix + out) / block)``."""
    return -(-(prefix_tokens + out_tokens) // block)


def block_pmf(lengths: Mapping[int, float], prefix_tokens: int, block: int = BLOCK_SIZE) -> np.ndarray:
    """One page's KV blocks as a probability array (index = blocks) from output tokens ->
    probability (:meth:`~ocrserve.gpu.lengths.OutputLengths.distribution`)."""
    top = max(page_blocks(prefix_tokens, n, block) for n in lengths)
    pmf = np.zeros(top + 1)
    for n, p in lengths.items():
        pmf[page_blocks(prefix_tokens, n, block)] += p
    return pmf / pmf.sum()


def _convolve(dist: np.ndarray, pmf: np.ndarray, size: int) -> np.ndarray:
    if len(dist) * len(pmf) <= _DIRECT:
        out = np.convolve(dist, pmf)[:size]
    else:
        n = 1 << (len(dist) + len(pmf) - 1).bit_length()
        out = np.fft.irfft(np.fft.rfft(dist, n) * np.fft.rfft(pmf, n), n)[:size]
        np.clip(out, 0.0, None, out=out)
    return out


def overflow_curve(pmf: np.ndarray, capacity: Callable[[int], int], up_to: int) -> list[float]:
    """``P(sum of n pages' blocks > capacity(n))`` for ``n = 1..up_to`` (index ``n - 1``);
    ``capacity(n)``: KV blocks the cache holds with ``max_num_seqs = n``, never growing with ``n``.
    Once the chance is 1 (to 1e-12) it stays 1 and is not computed further."""
    top = capacity(1)
    dist = np.zeros(1)
    dist[0] = 1.0
    curve: list[float] = []
    for n in range(1, up_to + 1):
        if curve and curve[-1] >= 1 - 1e-12:
            curve.append(1.0)
            continue
        dist = _convolve(dist, pmf, top + 1)
        held = min(capacity(n), len(dist) - 1)
        curve.append(float(min(1.0, max(0.0, 1.0 - dist[: held + 1].sum()))))
    return curve


def statistical_seqs(curve: list[float], target: float) -> int:
    """The largest ``N`` whose overflow chance (``curve[N - 1]``) is at most ``target`` with every
    smaller ``N``'s too; 0 when even one page overflows."""
    if not 0 <= target < 1:
        raise ValueError(f"overflow target must be in [0, 1), got {target}")
    n = 0
    while n < len(curve) and curve[n] <= target:
        n += 1
    return n


def model_checked_seqs(upper: int, lower: int, target: float, share: Callable[[int], float]) -> int:
    """The largest ``N`` in ``[lower, upper]`` whose share of pages preempted, ``share(N)`` (the
    scheduler model's, :func:`ocrserve.gpu.scheduler_model.preempted_share`), is within ``target``;
    ``lower`` (the worst case, which never preempts) when none above it is. Binary search: the
    share grows with ``N``.

    The overflow chance alone is not enough: it takes ``N`` independent pages, while the pages
    running at a moment are biased to the long ones (a long page stays in the batch longer, so a
    slot holds one more often than the pages' own distribution says), and near a full cache
    one overflow is followed by others (the preempted page comes back with its prefill and its
    output, at the front of the queue). Measured on vLLM's CPU build (``scripts/wind_tunnel.py``,
    ``docs/wind-tunnel.md``): at the ``N`` of a 0.95% overflow chance, 16% of pages were preempted.
    """
    if upper <= lower or share(upper) <= target:
        return max(upper, lower)
    lo, hi = lower, upper - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if share(mid) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def worst_case_seqs(max_blocks: int, capacity: Callable[[int], int], cap: int) -> int:
    """The largest ``N <= cap`` with ``N`` pages of ``max_blocks`` each inside ``capacity(N)``."""
    n = 0
    while n < cap and (n + 1) * max_blocks <= capacity(n + 1):
        n += 1
    return n


@dataclass(frozen=True)
class Candidate:
    """One ``--max-num-seqs`` the plan compares.

    Attributes:
        name: ``"worst case"``, ``"statistical"`` or ``"vLLM default"``.
        seqs: the ``N``.
        overflow: chance that ``N`` pages at their final lengths outgrow the cache.
        kv_use: expected KV demand of ``N`` pages at their final lengths over the cache (may pass 1).
    """

    name: str
    seqs: int
    overflow: float
    kv_use: float


def expected_kv_use(pmf: np.ndarray, n: int, capacity_blocks: int) -> float:
    """``n`` x one page's mean blocks over the cache's blocks."""
    mean = float(np.dot(np.arange(len(pmf)), pmf))
    return n * mean / capacity_blocks if capacity_blocks else math.inf
