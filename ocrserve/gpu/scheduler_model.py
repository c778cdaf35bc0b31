"""A small discrete-event model of vLLM's scheduler: KV-block admission, decode steps, preemption.

It follows vLLM 0.32's v1 scheduler (``vllm/v1/core/sched/scheduler.py`` ``schedule``) and KV
cache manager (``vllm/v1/core/kv_cache_manager.py`` ``allocate_slots``,
``vllm/v1/core/block_pool.py``), reduced to what decides throughput and preemption for OCR pages:

* **Blocks.** A request holds ``ceil(tokens in its KV / 16)`` blocks out of one pool of ``C``
  (the plan's KV cache); each decode step writes one token per running request, which needs a new
  block every 16 tokens (``allocate_slots`` with ``num_new_tokens`` 1). No watermark (vLLM's
  ``SchedulerConfig.watermark`` defaults to 0.0) and no prefix caching (the recipes turn it off).
* **Running first.** Each step serves the running requests in order; one whose block cannot be
  allocated preempts the lowest-priority running request: with equal priorities the newest
  (``max(running, key=(priority, arrival_time))`` under ``--scheduling-policy priority``,
  ``running[-1]`` under fcfs: the same here), until it fits or preempts itself.
* **Preemption is recompute.** The preempted request frees all its blocks, its computed tokens
  drop to 0 and it goes back to the *front* of the waiting queue (``_preempt_request``:
  ``num_computed_tokens = 0``, ``waiting.prepend_request``); readmitted, it prefills its prompt
  *and* the output it had made, then decodes on.
* **Admission.** Waiting requests are admitted only in a step that preempted none, while fewer
  than ``--max-num-seqs`` run, in order, while the head's prefill blocks fit (a head that does not
  fit stops admission: FCFS) and within ``--max-num-batched-tokens`` less the step's decode tokens
  (at least one page per step: chunked prefill spreads a larger one, same compute).

Time advances by step: :class:`StepTime` gives a step's seconds from its decode batch, the tokens
its running requests hold (the KV the step reads) and the prefill tokens it computes. On a GPU,
:class:`GpuStepTime`, from memory traffic: weights plus the KV read per step over the GPU's
bandwidth from the registry, prefill at a compute rate (both estimates); on vLLM's CPU backend,
:class:`LinearStepTime` fitted from measured steps, ``a + b x batch + c x prefill tokens``.

The load is a closed loop: ``in_flight`` pages always submitted (the gateway keeps
``max_num_seqs x router.slot_overcommit`` in flight; default ``max_num_seqs``), each a draw from
the output-length model. Between events (a page finishing, the pool running out of blocks) steps
are advanced in one jump, so a prediction of thousands of pages takes well under a second.

Speculative decoding (a draft proposing tokens the model verifies) is taken as its reported speedup
at the running batch (:func:`speedup_at`): a step's seconds divided by it. This is where the gain
falls with the batch.

Hook for the wind tunnel: :func:`simulate` takes the same ``StepTime`` a measured run fits
(:meth:`LinearStepTime.fit` over windows of steps from vLLM's metrics) and
returns :class:`Prediction` with the figures ``ocrserve bench`` measures (pages/s, p95,
preemptions: vLLM's ``vllm:num_preemptions_total``), so a bench run against the real CPU vLLM
can be set beside the prediction for the same ``--max-num-seqs``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ocrserve.gpu.memory import BLOCK_SIZE
from ocrserve.quantiles import nearest_rank

PREFILL_FLOPS_PER_BYTE = 150.0
"""Prefill compute per byte/s of bandwidth, estimate: prefill is compute-bound, and datasheet
dense bf16 over bandwidth is ~295 FLOP/byte on an H100 SXM (989 TFLOPS / 3.35 TB/s) and ~165 on
an RTX 4090 (165 / 1.0); half the H100's figure stands for both at a realistic utilization."""
SIMULATED_PAGES = 2000
"""Pages a prediction runs (after :data:`WARM_UP_PAGES`)."""
WARM_UP_PAGES = 300
"""Pages finished before a prediction measures, so the batch is in its steady state."""


class StepTime:
    """Seconds of one scheduler step (see the module docstring)."""

    def seconds(self, batch: int, context_tokens: float, prefill_tokens: int) -> float:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class GpuStepTime(StepTime):
    """A GPU step from memory traffic: ``(weights + context x kv_per_token) / rate`` for the
    decode, plus ``prefill x 2 x parameters / (rate x PREFILL_FLOPS_PER_BYTE)``; ``rate`` =
    bandwidth x efficiency.

    Attributes:
        weights_bytes: bytes read once per step (the weights, draft included).
        kv_bytes_per_token: KV bytes of one token (all layers).
        parameters: parameters one prefill token is multiplied through.
        bandwidth: bytes/s the step achieves (datasheet x efficiency).
    """

    weights_bytes: int
    kv_bytes_per_token: int
    parameters: int
    bandwidth: float

    def seconds(self, batch: int, context_tokens: float, prefill_tokens: int) -> float:
        decode = (self.weights_bytes + context_tokens * self.kv_bytes_per_token) / self.bandwidth if batch else 0.0
        prefill = prefill_tokens * 2 * self.parameters / (self.bandwidth * PREFILL_FLOPS_PER_BYTE)
        return decode + prefill

    def describe(self) -> str:
        return (
            f"step = (weights {self.weights_bytes / 2**30:.2f} GiB + KV read {self.kv_bytes_per_token:,} B/token) "
            f"/ {self.bandwidth / 1e9:.0f} GB/s, prefill at {PREFILL_FLOPS_PER_BYTE:g} FLOP/byte (estimates)"
        )


@dataclass(frozen=True)
class LinearStepTime(StepTime):
    """``a + b x batch + c x prefill tokens`` seconds: vLLM's CPU backend, fitted from measured
    steps (:meth:`fit`).

    Attributes:
        a: seconds of a step whatever its batch.
        b: seconds each running request adds.
        prefill_per_token: seconds per prefill token.
        source: where the figures come from.
    """

    a: float
    b: float
    prefill_per_token: float = 0.0
    source: str = "given"

    def seconds(self, batch: int, context_tokens: float, prefill_tokens: int) -> float:
        return (self.a + self.b * batch if batch else 0.0) + self.prefill_per_token * prefill_tokens

    def describe(self) -> str:
        return (
            f"step = {self.a * 1e3:.2f} ms + {self.b * 1e3:.3f} ms x batch + {self.prefill_per_token * 1e3:.4f} ms "
            f"x prefill token ({self.source})"
        )

    @classmethod
    def fit(cls, windows: Sequence[tuple[int, int, int, float]], source: str = "") -> LinearStepTime:
        """Least squares of measured windows ``(steps, decode tokens, prefill tokens, seconds)``.

        A window of ``S`` steps whose decode batches sum to ``G`` tokens and whose prefills to
        ``P`` takes ``a S + b G + c P`` seconds (a step's formula summed over its steps; one step is
        the window ``(1, batch, prefill, seconds)``). vLLM's metrics give exactly these sums
        between two scrapes: ``vllm:iteration_tokens_total`` (a histogram observed once a step:
        its ``_count`` is ``S``), ``vllm:generation_tokens_total`` (``G``) and the histogram's
        ``_sum`` less ``G`` (``P``; ``vllm/v1/metrics/loggers.py``). Coefficients are kept >= 0:
        one that comes out negative is set to 0 and the others refitted.

        Raises:
            ValueError: fewer than two windows, or decode tokens per step all alike (``a`` and
                ``b`` cannot be told apart).
        """
        rows = np.array([[s, g, p] for s, g, p, _ in windows], float)
        seconds = np.array([t for *_, t in windows], float)
        batches = {round(g / s, 3) for s, g, _, _ in windows if s}
        if len(windows) < 2 or len(batches) < 2:
            raise ValueError("fitting a + b x batch needs windows at two mean batch sizes or more")
        used = [0, 1, 2] if rows[:, 2].any() else [0, 1]
        while True:
            coef = np.linalg.lstsq(rows[:, used], seconds, rcond=None)[0]
            if (coef >= 0).all() or len(used) == 1:
                break
            used.pop(int(np.argmin(coef)))
        full = dict(zip(used, np.clip(coef, 0.0, None), strict=True))
        return cls(full.get(0, 0.0), full.get(1, 0.0), full.get(2, 0.0), source or f"fitted to {len(windows)} windows")


def speedup_at(points: Sequence[tuple[int, float]], batch: int) -> float:
    """A speculative decoder's speedup at ``batch`` from reported ``(concurrency, speedup)``:
    linear in log(concurrency) between the points, the end points' value beyond them (no gain
    assumed to come back), never below 1 (vLLM's drafter can always be outvoted)."""
    if not points or batch < 1:
        return 1.0
    ordered = sorted(points)
    if batch <= ordered[0][0]:
        return max(1.0, ordered[0][1])
    for (c0, s0), (c1, s1) in zip(ordered, ordered[1:], strict=False):
        if batch <= c1:
            t = (math.log(batch) - math.log(c0)) / (math.log(c1) - math.log(c0))
            return max(1.0, s0 + t * (s1 - s0))
    return max(1.0, ordered[-1][1])


@dataclass(frozen=True)
class Prediction:
    """What :func:`simulate` predicts for one ``--max-num-seqs``.

    Attributes:
        max_num_seqs: the ``N`` simulated.
        pages_per_s: pages finished per second (a prediction).
        p50_s, p95_s: page latency from submission to its last token, seconds.
        preemptions_per_page: preemptions (recomputes) per finished page.
        preempted_share: share of pages preempted at least once.
        mean_running: mean decode batch over time.
        kv_use: mean share of the KV blocks in use over time.
    """

    max_num_seqs: int
    pages_per_s: float
    p50_s: float
    p95_s: float
    preemptions_per_page: float
    preempted_share: float
    mean_running: float
    kv_use: float


def simulate(
    *,
    max_num_seqs: int,
    kv_blocks: int,
    prefix_tokens: int,
    lengths: Sequence[int],
    weights: Sequence[float] | None,
    step_time: StepTime,
    batched_tokens: int,
    in_flight: int | None = None,
    speedup: Sequence[tuple[int, float]] = (),
    pages: int = SIMULATED_PAGES,
    warm_up: int = WARM_UP_PAGES,
    seed: int = 0,
    block: int = BLOCK_SIZE,
    window: tuple[float, float] | None = None,
    draws: Sequence[int] | None = None,
) -> Prediction:
    """Run the closed loop of the module docstring and measure after ``warm_up`` pages, or, with
    ``window``, the pages that finish between its two times (seconds from the start, all
    ``in_flight`` pages submitted at 0: how a wind-tunnel run measures).

    Args:
        max_num_seqs: ``--max-num-seqs``.
        kv_blocks: blocks in the KV cache.
        prefix_tokens: a page's visual + prompt tokens.
        lengths, weights: output tokens and their probabilities (None: equally likely).
        step_time: a step's seconds.
        batched_tokens: ``--max-num-batched-tokens``.
        in_flight: pages submitted at once (default ``max_num_seqs``).
        speedup: a speculative decoder's ``(concurrency, speedup)`` points; empty for none.
        pages, warm_up, seed: how many pages are measured, after how many, and the draws' seed.
        block: tokens a KV block holds (16 on a GPU; 128 on vLLM's CPU backend).
        window: ``(start, end)`` seconds to measure in, in place of ``pages`` and ``warm_up``.
        draws: the pages' output lengths in the order they are submitted (a measured run's own),
            drawn on from ``lengths`` once they run out; None: all drawn.

    Raises:
        ValueError: a page that alone does not fit the cache (vLLM refuses to start then).
    """
    rng = np.random.default_rng(seed)
    total = pages + warm_up

    def more(count: int) -> np.ndarray:
        return rng.choice(np.asarray(lengths, int), size=count, p=weights)

    first = np.asarray(draws, int) if draws is not None else more(total + (in_flight or max_num_seqs) + 1)
    if -(-(prefix_tokens + int(max(lengths))) // block) > kv_blocks:
        raise ValueError("one page at its longest does not fit the KV cache")
    run = _Run(max_num_seqs, kv_blocks, prefix_tokens, step_time, batched_tokens, speedup or [(1, 1.0)], block)
    run.draws, run.more, run.warm_up, run.window = first, more, warm_up, window
    for _ in range(in_flight or max_num_seqs):
        run.submit()
    while (run.now <= window[1]) if window else (run.finished < total):
        if not run.preempted_last:
            run.admit()
        run.preempted_last = False
        if not run.running:
            raise ValueError("nothing can run: the KV cache holds no page")  # pragma: no cover
        run.advance(run.steps_to_event())
        if not run.retire():
            run.step_out_of_blocks()
    return run.prediction()


class _Run:
    """The state of one :func:`simulate` run: the waiting queue, the running requests with the
    tokens in their KV and the tokens still to make, the free blocks, the clock and the counts."""

    def __init__(
        self,
        max_num_seqs: int,
        kv_blocks: int,
        prefix_tokens: int,
        step_time: StepTime,
        batched_tokens: int,
        spec: Sequence[tuple[int, float]],
        block: int,
    ):
        self.max_num_seqs, self.kv_blocks, self.prefix_tokens = max_num_seqs, kv_blocks, prefix_tokens
        self.step_time, self.batched_tokens, self.spec, self.block = step_time, batched_tokens, spec, block
        self.draws = np.zeros(0, np.int64)  # the pages' output lengths, in submission order
        self.more: Callable[[int], np.ndarray] = lambda count: self.draws[:count]  # count further ones
        self.warm_up = 0  # pages finished before the measurement
        self.window: tuple[float, float] | None = None  # or the times it measures between
        # a request: [id, output length, tokens made, submitted at, preemptions]
        self.waiting: deque[list] = deque()
        self.submitted = 0
        self.running: list[list] = []  # requests in admission order
        self.ctx = np.zeros(0, np.int64)  # tokens in each running request's KV
        self.left = np.zeros(0, np.int64)  # tokens each still has to make
        self.free = kv_blocks
        self.now = 0.0
        self.finished = 0
        self.latencies: list[float] = []
        self.preemptions = 0
        self.preempted_pages = 0
        self.measure_from: float | None = None
        self.busy_batch = self.busy_kv = self.measured_time = 0.0
        self.preempted_last = False
        self.prefill = 0  # tokens the coming step prefills
        self.factor = 1.0  # the speculative speedup's divisor at the last step's batch

    def submit(self) -> None:
        """Queue the next page of the closed loop, submitted now."""
        if self.submitted == len(self.draws):
            self.draws = np.append(self.draws, self.more(len(self.draws) + 1))
        self.waiting.append([self.submitted, int(self.draws[self.submitted]), 0, self.now, 0])
        self.submitted += 1

    def admit(self) -> None:
        """Admit waiting requests in order while slots, blocks and the step's token budget allow."""
        budget = self.batched_tokens - len(self.running)
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            tokens = self.prefix_tokens + req[2]
            need = -(-tokens // self.block)
            if need > self.free or (self.prefill and self.prefill + tokens > budget):
                break
            self.waiting.popleft()
            self.free -= need
            self.prefill += tokens
            req[2] += 1  # the prefill step samples the next token
            self.running.append(req)
            self.ctx = np.append(self.ctx, tokens)
            self.left = np.append(self.left, req[1] - req[2])

    def steps_to_event(self) -> int:
        """Decode steps until the first finish, the head's admission or the pool's running out."""
        # steps until the first finish; the admitted ones may finish at once (1-token pages)
        k = 0 if (self.left <= 0).any() else int(self.left.min())
        head_fits = self.waiting and -(-(self.prefix_tokens + self.waiting[0][2]) // self.block) <= self.free
        if k and head_fits and len(self.running) < self.max_num_seqs:
            k = 1  # the head can be admitted at the next step
        blocks_now = -(-self.ctx // self.block)
        if k and _demand(self.ctx, blocks_now, k, self.block) > self.free:
            lo, hi = 0, k
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if _demand(self.ctx, blocks_now, mid, self.block) <= self.free:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        return k

    def advance(self, k: int) -> None:
        """Run ``k`` decode steps in one jump (the step's prefill included); 0: the prefill alone."""
        n, prefill, seconds = len(self.running), self.prefill, self.step_time.seconds
        self.factor = 1 / speedup_at(self.spec, n)
        c0 = float(self.ctx.sum())
        if k:
            first = seconds(n, c0, prefill) - seconds(0, 0, prefill)
            per = seconds(n, c0 + n, 0) - seconds(n, c0, 0)
            elapsed = (k * first + per * k * (k - 1) / 2) * self.factor + seconds(0, 0, prefill)
            self.free -= _demand(self.ctx, -(-self.ctx // self.block), k, self.block)
            self.ctx = self.ctx + k
            self.left = self.left - k
        else:
            elapsed = seconds(0, 0, prefill)
        self.prefill = 0
        self._account(n, elapsed)

    def _account(self, batch: int, elapsed: float) -> None:
        if self.measure_from is not None:
            self.busy_batch += batch * elapsed
            self.busy_kv += (self.kv_blocks - self.free) * elapsed
            self.measured_time += elapsed
        self.now += elapsed

    def retire(self) -> bool:
        """Finish the requests that made all their tokens and submit one page for each; whether any did."""
        finished_mask = self.left <= 0
        if not finished_mask.any():
            return False
        for i in np.flatnonzero(finished_mask):
            req = self.running[i]
            self.free += int(-(-self.ctx[i] // self.block))
            self.finished += 1
            window = self.window
            if (window[0] <= self.now <= window[1]) if window else self.finished > self.warm_up:
                self.latencies.append(self.now - req[3])
                self.preemptions += req[4]
                self.preempted_pages += req[4] > 0
            if self.measure_from is None and (self.now >= window[0] if window else self.finished == self.warm_up):
                self.measure_from = self.now
            self.submit()
        keep = ~finished_mask
        self.running = [r for r, kept in zip(self.running, keep, strict=True) if kept]
        self.ctx, self.left = self.ctx[keep], self.left[keep]
        return True

    def step_out_of_blocks(self) -> None:
        """The pool runs out within the next step: serve the running requests in order, preempting
        the newest (recompute) until each one served has its block."""
        need = (-(-(self.ctx + 1) // self.block)) - (-(-self.ctx // self.block))
        i = 0
        gone: list[int] = []
        while i < len(self.running) - len(gone):
            if need[i] and self.free < 1:
                victim = len(self.running) - 1 - len(gone)
                self.free += int(-(-self.ctx[victim] // self.block))
                gone.append(victim)
                req = self.running[victim]
                req[2] = req[1] - int(self.left[victim])  # what it had made: recomputed on readmission
                req[4] += 1
                if victim == i:
                    break
                continue
            self.free -= int(need[i])
            i += 1
        served = len(self.running) - len(gone)
        step = self.step_time.seconds(served, float(self.ctx[:served].sum()), 0) * self.factor
        self._account(served, step)
        for victim in gone:  # newest first: prepending each leaves the oldest at the front
            self.waiting.appendleft(self.running[victim])
        self.running = self.running[:served]
        self.ctx, self.left = self.ctx[:served] + 1, self.left[:served] - 1
        self.preempted_last = bool(gone)

    def prediction(self) -> Prediction:
        """The figures measured after the warm-up."""
        span = (self.window[1] - self.window[0]) if self.window else self.now - (self.measure_from or 0.0)
        ordered = sorted(self.latencies)
        measured = self.measured_time
        return Prediction(
            max_num_seqs=self.max_num_seqs,
            pages_per_s=len(self.latencies) / span if span > 0 else math.inf,
            p50_s=_pct(ordered, 50),
            p95_s=_pct(ordered, 95),
            preemptions_per_page=self.preemptions / len(self.latencies),
            preempted_share=self.preempted_pages / len(self.latencies),
            mean_running=self.busy_batch / measured if measured else 0.0,
            kv_use=self.busy_kv / measured / self.kv_blocks if measured else 0.0,
        )


CHECK_RUNS = 3
"""Simulated runs (seeds 0, 1, 2) whose mean :func:`preempted_share` is: one run's share near the
edge of the cache swings by a few percent with the draws."""
UNIT_STEP = LinearStepTime(1.0, 0.0, 0.0, "one unit a step")
"""The step time of a run that counts only preemptions: with the batch and the cache alike, which
page is preempted when depends on steps, not on their seconds."""


def preempted_share(*, max_num_seqs: int, runs: int = CHECK_RUNS, **scenario) -> float:
    """The mean share of pages preempted at least once over ``runs`` closed-loop runs of
    :func:`simulate` (``scenario``: its keyword arguments but ``max_num_seqs``, ``step_time`` and
    ``seed``) with ``max_num_seqs`` pages in flight, one unit a step (:data:`UNIT_STEP`)."""
    shares = [
        simulate(max_num_seqs=max_num_seqs, step_time=UNIT_STEP, seed=seed, **scenario).preempted_share
        for seed in range(runs)
    ]
    return sum(shares) / runs


def _demand(ctx: np.ndarray, blocks_now: np.ndarray, steps: int, block: int) -> int:
    """New blocks the running requests need over the next ``steps`` steps."""
    return int((-(-(ctx + steps) // block) - blocks_now).sum())


def _pct(ordered: list[float], q: float) -> float:
    if not ordered:
        return math.nan
    return nearest_rank(ordered, q / 100)
