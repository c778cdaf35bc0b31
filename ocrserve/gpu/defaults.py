"""Why not vLLM's defaults: what ``vllm serve MODEL`` with no batching flags would do to this model
and page budget on this GPU, next to the plan (``ocrserve plan --compare-defaults``).

vLLM's defaults are the target release's (:meth:`~ocrserve.gpu.vllm_versions.Accounting.default_batch`):
``--max-num-seqs`` 256 or 1024, ``--max-num-batched-tokens`` 2048, 8192 or 16384 by GPU,
``--max-model-len`` the model's positions, every modality allowed. Each is run through the same
start-up arithmetic as the plan (:func:`~ocrserve.gpu.planner.predict_startup`), so the
consequences are the planner's predictions: a refused start-up, a page's prefill split over
several steps, pages preempted because the batch outgrows the KV cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ocrserve.gpu.memory import Startup, predict_startup
from ocrserve.gpu.planner import Plan
from ocrserve.gpu.vllm_versions import accounting_for


@dataclass(frozen=True)
class Difference:
    """One flag: vLLM's default, the plan's value, and what the default would do.

    Attributes:
        flag: the ``vllm serve`` flag.
        default: vLLM's value when the flag is not given.
        planned: the plan's value.
        consequence: what the default does to this model and page budget.
    """

    flag: str
    default: object
    planned: object
    consequence: str


def compare_defaults(plan: Plan) -> list[Difference]:
    """What vLLM's defaults would do next to ``plan`` (see the module docstring).

    Raises:
        ocrserve.gpu.planner.PlanError: the plan's release is not one the planner follows.
    """
    model, gpu, args = plan.model, plan.gpu, plan.vllm_args
    seqs, batched = accounting_for(plan.vllm_version).default_batch(gpu)
    model_len = model.max_position_embeddings
    batched = min(batched, seqs * model_len)
    tp = int(args.get("tensor_parallel_size", 1))
    pp = int(args.get("pipeline_parallel_size", 1))
    mm = args.get("mm_processor_kwargs") or {}
    start = predict_startup(
        model,
        gpu,
        max_model_len=model_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        gpu_memory_utilization=float(args["gpu_memory_utilization"]),
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        kv_cache_dtype=str(args.get("kv_cache_dtype", "auto")),
        vllm_version=plan.vllm_version,
        max_pixels=mm.get("max_pixels"),
    )
    page, prefill = int(plan.value("page_tokens")), int(plan.value("visual_tokens")) + int(plan.value("prompt_tokens"))
    rows = [
        Difference("--max-model-len", model_len, args["max_model_len"], _model_len(start)),
        Difference("--max-num-seqs", seqs, args["max_num_seqs"], _preemption(start, seqs, page)),
        Difference("--max-num-batched-tokens", batched, args["max_num_batched_tokens"], _chunking(batched, prefill)),
    ]
    if "limit_mm_per_prompt" in args:
        rows.append(_modalities(plan))
    return rows


def _model_len(start: Startup) -> str:
    if start.error:
        return f"start-up fails: {start.error}"
    return (
        f"starts: {start.kv_tokens:,} KV tokens hold {start.max_concurrency:.2f} sequences of "
        f"{start.max_model_len:,} tokens; one page never needs more than the plan's length"
    )


def _preemption(start: Startup, seqs: int, page: int) -> str:
    if start.kv_tokens <= 0:
        return "no KV cache is left at this batch size"
    fit = start.kv_tokens // page
    if seqs <= fit:
        return f"{seqs} pages of {page:,} tokens fit in {start.kv_tokens:,} KV tokens: no preemption"
    return (
        f"{seqs} pages of {page:,} tokens need {seqs * page:,} KV tokens, {start.kv_tokens:,} are left: beyond "
        f"{fit} pages decoding at once vLLM preempts pages and recomputes them"
    )


def _chunking(batched: int, prefill: int) -> str:
    if batched >= prefill:
        return f"one page's prefill ({prefill:,} tokens) fits in one step"
    return (
        f"one page's prefill ({prefill:,} tokens) is split over {math.ceil(prefill / batched)} scheduler steps "
        "(chunked prefill): a page waits several steps for its first token"
    )


def _modalities(plan: Plan) -> Difference:
    limit = plan.vllm_args["limit_mm_per_prompt"]
    video = "video" in limit
    consequence = (
        "every modality allowed (999 items): vLLM profiles its encoder with a video, larger than any page, "
        "and sizes the encoder cache for it"
        if video
        else "one image per page is all a page sends; the default only raises what a client may send"
    )
    return Difference("--limit-mm-per-prompt", "999 per modality", limit, consequence)
