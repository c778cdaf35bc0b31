"""``--max-num-seqs`` three ways, side by side: worst case, statistical, vLLM's default.

For a plan's KV cache (:class:`~ocrserve.gpu.memory.Memory`) and page (:class:`~ocrserve.gpu.memory.Budget`)
and an output-length model (:mod:`ocrserve.gpu.lengths`):

* **worst case**: every page at ``max_tokens`` (the planner's ``seqs_by_memory``): never preempts;
* **statistical**: the largest ``N`` whose chance of outgrowing the cache, all ``N`` pages at their
  final lengths, stays within the target (:mod:`ocrserve.gpu.overflow`, exact), and whose share
  of pages preempted in the scheduler model is within it too
  (:func:`~ocrserve.gpu.overflow.model_checked_seqs`);
* **vLLM's default**: what ``vllm serve`` runs with no flag (``Accounting.default_batch``).

For each: the overflow chance, the expected KV demand and, with ``predict``, the scheduler
model's predicted pages/s, p95 and preemptions (:mod:`ocrserve.gpu.scheduler_model`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ocrserve.gpu.lengths import OutputLengths
from ocrserve.gpu.memory import BLOCK_SIZE, Budget, Memory
from ocrserve.gpu.overflow import (
    Candidate,
    block_pmf,
    expected_kv_use,
    model_checked_seqs,
    overflow_curve,
    page_blocks,
    statistical_seqs,
)
from ocrserve.gpu.scheduler_model import Prediction, StepTime, preempted_share, simulate


@dataclass
class Concurrency:
    """The comparison a plan carries (``Plan.concurrency``).

    Attributes:
        lengths: the output-length model used.
        target: the overflow target.
        candidates: worst case, statistical, vLLM's default (in that order).
        predictions: ``N`` -> the scheduler model's prediction (empty without ``predict``).
        step_time: how a step's seconds were modelled ("" without predictions).
        lookahead: tokens a running request reserves for speculative proposals (0 without).
        model: what the scheduler model runs on (None without predictions).
        by_chance: the largest ``N`` by the overflow chance alone, before the scheduler model's
            check of its preemptions (:func:`~ocrserve.gpu.overflow.model_checked_seqs`).
    """

    lengths: OutputLengths
    target: float
    candidates: list[Candidate]
    predictions: dict[int, Prediction] = field(default_factory=dict)
    step_time: str = ""
    lookahead: int = 0
    model: SchedulerInputs | None = None
    by_chance: int = 0

    def candidate(self, name: str) -> Candidate:
        """The candidate called ``name``."""
        return next(c for c in self.candidates if c.name == name)

    def to_dict(self) -> dict:
        """Plain data for ``--format json|yaml``."""
        return {
            "output_lengths": {"kind": self.lengths.kind, "source": self.lengths.source},
            "overflow_target": self.target,
            "candidates": [
                {
                    "name": c.name,
                    "max_num_seqs": c.seqs,
                    "overflow": round(c.overflow, 6),
                    "expected_kv_use": round(c.kv_use, 4),
                    **({"predicted": _prediction_dict(self.predictions[c.seqs])} if c.seqs in self.predictions else {}),
                }
                for c in self.candidates
            ],
            "step_time": self.step_time,
        }


@dataclass(frozen=True)
class SchedulerInputs:
    """A plan's figures the scheduler model (:func:`~ocrserve.gpu.scheduler_model.simulate`) runs on.

    Attributes:
        mem: the plan's memory (its KV cache for each ``N``).
        prefix: a page's visual + prompt tokens, with the speculative lookahead.
        dist: output tokens -> probability.
        step_time: a step's seconds.
        speedup: a speculative decoder's reported ``(concurrency, speedup)``.
    """

    mem: Memory
    prefix: int
    dist: dict[int, float]
    step_time: StepTime
    speedup: tuple[tuple[int, float], ...] = ()

    def predict(self, seqs: int, in_flight: int | None = None) -> Prediction:
        """The prediction for ``--max-num-seqs seqs`` with ``in_flight`` pages submitted (default
        ``seqs``)."""
        return simulate(
            max_num_seqs=seqs,
            kv_blocks=self.mem.kv_tokens(max(seqs, 1)) // BLOCK_SIZE,
            prefix_tokens=self.prefix,
            lengths=list(self.dist),
            weights=list(self.dist.values()),
            step_time=self.step_time,
            batched_tokens=self.mem.batched_tokens,
            in_flight=in_flight,
            speedup=self.speedup,
        )

    def throughput_curve(self, seqs: int) -> list[tuple[int, float]]:
        """Predicted ``(pages in flight, pages/s)`` at ``--max-num-seqs seqs`` for 1, 2, 4, ... pages
        in flight up to ``seqs``: the closed-loop sweep ``ocrserve bench`` measures, for
        :meth:`ocrserve.bench.capacity.ServiceModel.fit`."""
        points = sorted({min(2**i, seqs) for i in range(seqs.bit_length() + 1)})
        return [(n, self.predict(seqs, n).pages_per_s) for n in points]


def _prediction_dict(p: Prediction) -> dict:
    return {
        "pages_per_s": round(p.pages_per_s, 3),
        "p50_s": round(p.p50_s, 2),
        "p95_s": round(p.p95_s, 2),
        "preemptions_per_page": round(p.preemptions_per_page, 4),
        "preempted_share": round(p.preempted_share, 4),
        "mean_running": round(p.mean_running, 1),
        "kv_use": round(p.kv_use, 3),
    }


def compare(
    mem: Memory,
    budget: Budget,
    lengths: OutputLengths,
    target: float,
    *,
    worst_case: int,
    vllm_default: int,
    cap: int,
    lookahead: int = 0,
    step_time: StepTime | None = None,
    speedup: Sequence[tuple[int, float]] = (),
) -> Concurrency:
    """The three candidates (module docstring) and, with ``step_time``, their predictions.

    Args:
        mem, budget: the plan's memory and page.
        lengths, target: the output-length model and the overflow target.
        worst_case: the planner's worst-case ``N``.
        vllm_default: vLLM's own ``--max-num-seqs`` on this GPU and release.
        cap: the largest ``N`` considered (the CUDA-graph cap).
        lookahead: tokens each running request reserves beyond its own (speculative proposals).
        step_time: a step's seconds; None: no predictions.
        speedup: a speculative decoder's reported ``(concurrency, speedup)``.
    """
    prefix = budget.visual + budget.prompt + lookahead
    dist = lengths.distribution(budget.max_tokens)
    pmf = block_pmf(dist, prefix)

    def capacity(n: int) -> int:
        return mem.kv_tokens(max(n, 1)) // BLOCK_SIZE

    curve = overflow_curve(pmf, capacity, max(cap, vllm_default, worst_case))
    by_chance = min(statistical_seqs(curve, target), cap)
    statistical = model_checked_seqs(
        by_chance,
        min(worst_case, by_chance),
        target,
        lambda n: preempted_share(
            max_num_seqs=n,
            kv_blocks=capacity(n),
            prefix_tokens=prefix,
            lengths=list(dist),
            weights=list(dist.values()),
            batched_tokens=mem.batched_tokens,
        ),
    )
    candidates = [
        Candidate(name, n, curve[n - 1] if n else 1.0, expected_kv_use(pmf, n, capacity(n)))
        for name, n in (("worst case", worst_case), ("statistical", statistical), ("vLLM default", vllm_default))
    ]
    result = Concurrency(lengths, target, candidates, lookahead=lookahead, by_chance=by_chance)
    if step_time is not None:
        result.step_time = step_time.describe()
        result.model = SchedulerInputs(mem, prefix, dist, step_time, tuple(speedup))
        for c in candidates:
            if c.seqs and c.seqs not in result.predictions:
                result.predictions[c.seqs] = result.model.predict(c.seqs)
    return result


def blocks_per_page(budget: Budget, lookahead: int = 0) -> int:
    """KV blocks of one worst-case page."""
    return page_blocks(budget.visual + budget.prompt + lookahead, budget.max_tokens)
