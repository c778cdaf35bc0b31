"""Memory math that turns (GPU, model, pixel budget, output budget) into ``vllm serve`` flags.

vLLM gives the KV cache whatever is left of ``gpu_memory_utilization x GPU memory`` after the
weights, the activation peak of a profiling forward pass, CUDA graphs and the CUDA context
(``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``). The planner estimates the same
terms ahead of time, divides the KV cache by the tokens one page can need (visual tokens at the
pixel budget + prompt + the full output budget) and so sets ``--max-num-seqs`` to the number of
pages that can decode at once without any of them ever being preempted. Every number is kept with
its derivation (:class:`Step`) so ``ocrserve plan`` can show its work. This module returns data
(:class:`Plan`, its ``argv`` and ``to_dict``); the table/yaml/json/argv renderers are the CLI's
(:mod:`ocrserve.cli.plan_render`).

Units: bytes for memory, tokens for sequence quantities, seconds for latency. Estimates (activation
peak, CUDA-graph and context reserves, decode speed) are labelled as such; vLLM measures the real
values at start-up, and the planned ``--max-num-seqs`` stays valid as long as the estimates are not
below the measurement, which is why each of them errs high.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ocrserve.gpu.registry import GIB, GPUS, GpuSpec
from ocrserve.models import ModelSpec
from ocrserve.preprocess import geometry

DEFAULT_GPU_MEMORY_UTILIZATION = 0.90
"""vLLM's own default (``vllm/config/cache.py`` ``gpu_memory_utilization = 0.9``); lower it when the
GPU is shared with another process."""
BLOCK_SIZE = 16
"""KV-cache block, tokens (``vllm/config/cache.py`` ``CacheConfig.DEFAULT_BLOCK_SIZE = 16``)."""
MAX_NUM_SEQS_CAP = 512
"""Largest decode batch vLLM captures a CUDA graph for by default (``vllm/config/compilation.py``:
``max_cudagraph_capture_size`` 'capped at 512 by default'); larger batches would run eagerly."""
MIN_BATCHED_TOKENS = 8192
"""Floor for ``--max-num-batched-tokens``: vLLM's OpenAI-server default on >=70 GiB GPUs
(``vllm/engine/arg_utils.py`` ``get_batch_defaults``; 2048 on smaller cards). OCR prefills are
image-sized, so ocrserve keeps 8192 on every card and raises it to one full page when needed."""
BATCHED_TOKENS_ALIGN = 256
"""``--max-num-batched-tokens`` is rounded up to a multiple of this (tidy numbers; no vLLM rule)."""
CUDA_GRAPH_RESERVE = GIB // 2
"""Estimate, bytes. vLLM captures decode graphs for batch sizes up to 512 in one shared memory pool
and (since 0.2x) measures the pool in ``profile_cudagraph_memory``; its start-up log ('Graph
capturing finished ... took X GiB') shows a few hundred MiB for 1-8B models. 0.5 GiB errs high."""
CUDA_CONTEXT_RESERVE = 3 * GIB // 4
"""Estimate, bytes: memory outside PyTorch's allocator that vLLM counts as non-KV (CUDA context,
cuBLAS/cuDNN workspaces, NCCL buffers). The CUDA context alone is typically 300-500 MiB on current
drivers (PyTorch 'CUDA semantics' notes); 0.75 GiB errs high."""
ACTIVATION_BYTES = 2
"""Activations are computed in the model dtype (bf16/fp16: 2 bytes)."""
SAMPLER_BYTES_PER_LOGIT = 8
"""Sampler, bytes per vocabulary entry per sequence: fp32 logits (4) plus fp32 probabilities (4)
(vLLM's sampler upcasts logits to float32 before softmax, ``vllm/v1/sample/sampler.py``)."""
BANDWIDTH_EFFICIENCY = 0.8
"""Fraction of datasheet DRAM bandwidth a decode step achieves, estimate. A device-to-device copy
reached 4.3 of 4.8 TB/s (0.9) on an H200 here; 0.8 leaves room for kernel overheads."""
P95_OUTPUT_TOKENS = 2048
"""Output tokens of a 95th-percentile page, estimate: a dense A4 page holds ~4,000-6,000 characters,
~1,500-2,000 tokens for these tokenizers; the ``--p95`` estimate uses this, not ``max_tokens``."""


class PlanError(ValueError):
    """The model does not fit, or a requested setting cannot be met; the message says what would."""


@dataclass(frozen=True)
class Step:
    """One planned quantity and how it was derived.

    Attributes:
        key: stable machine name (``"kv_bytes_per_token"``).
        label: human name.
        value: the number (or text for choices).
        unit: ``"bytes"``, ``"tokens"``, ``"seqs"``, ``"s"``, ``"px"`` or ``""``.
        derivation: formula with the numbers filled in, and the source of any constant.
    """

    key: str
    label: str
    value: object
    unit: str
    derivation: str


@dataclass
class Plan:
    """A complete plan: vLLM engine arguments plus the derivation of each number.

    Attributes:
        model: the model planned for.
        gpu: the GPU (per device).
        gpus: GPUs in total.
        strategy: ``"single"``, ``"replicas"``, ``"tensor"`` or ``"pipeline"``.
        vllm_args: engine arguments in vLLM's spelling (``max_num_seqs``), in argv order.
        extra_flags: raw flags the model requires (``--trust-remote-code`` ...).
        steps: every quantity with its derivation.
        warnings: things the operator should know (none block the plan).
    """

    model: ModelSpec
    gpu: GpuSpec
    gpus: int
    strategy: str
    vllm_args: dict[str, object]
    extra_flags: tuple[str, ...]
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def value(self, key: str) -> object:
        """The value of the step named ``key``.

        Raises:
            KeyError: no such step.
        """
        for step in self.steps:
            if step.key == key:
                return step.value
        raise KeyError(key)

    def argv(self, executable: str = "vllm") -> list[str]:
        """The ``vllm serve MODEL ...`` command line as an argv list, vLLM's flag spelling."""
        args = [executable, "serve", self.model.id]
        for key, value in self.vllm_args.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif isinstance(value, dict):
                args += [flag, json.dumps(value, separators=(",", ":"))]
            else:
                args += [flag, str(value)]
        return args + list(self.extra_flags)

    def to_dict(self) -> dict:
        """The plan as plain data (str/int/float/bool/list/dict): model, GPU, strategy, vLLM
        arguments, argv, every step and the warnings; ``ocrserve plan --format json|yaml`` prints it."""
        return {
            "model": self.model.id,
            "gpu": {
                "name": self.gpu.name,
                "memory_gib": round(self.gpu.memory_gib, 2),
                "count": self.gpus,
                "bf16": self.gpu.bf16,
            },
            "strategy": self.strategy,
            "vllm_args": dict(self.vllm_args),
            "argv": self.argv(),
            "steps": [
                {"key": s.key, "label": s.label, "value": s.value, "unit": s.unit, "derivation": s.derivation}
                for s in self.steps
            ],
            "warnings": list(self.warnings),
        }


def gib(n: float) -> str:
    """``n`` bytes as GiB with two decimals."""
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class _Budget:
    """Inputs fixed before the memory arithmetic."""

    min_pixels: int | None
    max_pixels: int | None
    max_tokens: int
    visual: int
    prompt: int

    @property
    def page_tokens(self) -> int:
        return self.visual + self.prompt + self.max_tokens


@dataclass(frozen=True)
class _Memory:
    """Per-GPU memory arithmetic for one layout (tensor x pipeline shards)."""

    usable: int
    weights: int
    batched_tokens: int
    lm_activation: int
    encoder_activation: int
    encoder_cache: int
    sampler_per_seq: int
    kv_per_token: int
    fixed: int

    def seqs(self, page_tokens: int) -> int:
        """Pages that fit at once: ``floor((usable - fixed) / (page_tokens x kv/token + sampler/seq))``."""
        free = self.usable - self.fixed
        return max(0, free // (page_tokens * self.kv_per_token + self.sampler_per_seq))

    def kv_tokens(self, seqs: int) -> int:
        """KV tokens left once ``seqs`` sequences' sampler buffers are reserved, whole blocks."""
        free = self.usable - self.fixed - seqs * self.sampler_per_seq
        return max(0, free // self.kv_per_token // BLOCK_SIZE * BLOCK_SIZE)


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _memory(model: ModelSpec, gpu: GpuSpec, util: float, budget: _Budget, tp: int = 1, pp: int = 1) -> _Memory:
    act = ACTIVATION_BYTES
    batched = max(MIN_BATCHED_TOKENS, _round_up(budget.visual + budget.prompt, BATCHED_TOKENS_ALIGN))
    weights = model.parameters * model.dtype_bytes // (tp * pp)
    lm = batched * (4 * model.hidden_size + 3 * model.intermediate_size) * act // tp
    patches = budget.visual * model.merge_size**2
    encoder = patches * (4 * model.vision_hidden_size + 3 * model.vision_intermediate_size) * act
    cache = max(batched, budget.visual) * model.hidden_size * act
    kv_heads = math.ceil(model.num_kv_heads / tp)
    layers = math.ceil(model.num_layers / pp)
    kv = 2 * layers * kv_heads * model.head_dim * model.dtype_bytes
    fixed = weights + max(lm, encoder) + cache + CUDA_GRAPH_RESERVE + CUDA_CONTEXT_RESERVE
    return _Memory(
        int(gpu.memory_bytes * util),
        weights,
        batched,
        lm,
        encoder,
        cache,
        model.vocab_size * SAMPLER_BYTES_PER_LOGIT,
        kv,
        fixed,
    )


def _budget(model: ModelSpec, min_pixels: int | None, max_pixels: int | None, max_tokens: int | None) -> _Budget:
    lo = min_pixels if min_pixels is not None else model.min_pixels
    hi = max_pixels if max_pixels is not None else model.max_pixels
    if not model.supports_pixel_budget:
        lo = hi = None
    out = max_tokens if max_tokens is not None else model.max_tokens
    if lo is not None and hi is not None and hi < lo:
        raise PlanError(f"max_pixels {hi:,} is below min_pixels {lo:,}: a page could not satisfy both")
    if out < 1:
        raise PlanError(f"max_tokens must be >= 1, got {out}")
    return _Budget(lo, hi, out, model.max_visual_tokens(lo, hi), model.prompt_tokens())


def _check_factor(model: ModelSpec, factor: int | None, warnings: list[str]) -> None:
    if factor is None or not model.supports_pixel_budget:
        return
    if factor % model.factor:
        raise PlanError(
            f"preprocess.factor={factor} is not a multiple of {model.id}'s patch x merge factor "
            f"{model.factor} ({model.patch_size} x {model.merge_size}); vLLM would resize every page again. "
            f"Set preprocess.factor: {model.factor}."
        )
    if factor != model.factor:
        warnings.append(
            f"preprocess.factor={factor} is a multiple of the model's {model.factor}: pages are "
            "rounded coarser than the model needs (harmless)"
        )


def _p95_cap(model: ModelSpec, gpu: GpuSpec, mem: _Memory, budget: _Budget, target: float) -> tuple[int, str]:
    """Largest batch whose estimated p95 page latency fits ``target`` seconds.

    Decoding is memory-bound: each step streams the weights once and every running sequence's KV
    cache. ``step(B) = (weights + B x ctx x kv/token) / (bandwidth x efficiency)`` with ``ctx`` the
    mean context while a p95 page decodes (visual + prompt + half its output); a page takes
    ``P95_OUTPUT_TOKENS x step(B)``. Prefill (one compute-bound pass over the page's visual tokens,
    typically well under 10% of an OCR page's time) is not modelled.
    """
    if gpu.bandwidth_bytes_per_s <= 0:
        raise PlanError(
            f"--p95 needs the GPU's memory bandwidth, which is unknown for {gpu.name!r}; name a registry GPU with --gpu"
        )
    out = min(P95_OUTPUT_TOKENS, budget.max_tokens)
    ctx = budget.visual + budget.prompt + out // 2
    rate = gpu.bandwidth_bytes_per_s * BANDWIDTH_EFFICIENCY
    per_page_budget = target / out * rate  # bytes one decode step may stream
    cap = int((per_page_budget - mem.weights) // (ctx * mem.kv_per_token))
    one = out * (mem.weights + ctx * mem.kv_per_token) / rate
    if cap < 1:
        raise PlanError(
            f"p95 target {target:g} s is out of reach on {gpu.name}: even one page alone is estimated at "
            f"{one:.1f} s ({out} output tokens x {(mem.weights + ctx * mem.kv_per_token) / rate * 1e3:.2f} ms "
            f"per step); raise --p95, use a faster GPU or a smaller model"
        )
    derivation = (
        f"p95 page = {out} output tokens x step(B); step(B) = (weights {gib(mem.weights)} + B x "
        f"{ctx} ctx tokens x {mem.kv_per_token} B) / ({gpu.bandwidth_gbs:g} GB/s x "
        f"{BANDWIDTH_EFFICIENCY}); B <= {cap} keeps it <= {target:g} s (one page alone: {one:.2f} s)"
    )
    return cap, derivation


def _suggest(model: ModelSpec, gpu: GpuSpec, util: float, budget: _Budget, need: int) -> str:
    """What would fit ``need`` pages at once: a smaller pixel budget, a smaller output budget, or a GPU."""
    ideas = []
    if model.supports_pixel_budget and budget.max_pixels:
        step = model.factor**2
        lo, hi = step * 4, budget.max_pixels
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2 // step * step
            floor = min(budget.min_pixels or mid, mid)
            trial = _Budget(floor, mid, budget.max_tokens, model.max_visual_tokens(floor, mid), budget.prompt)
            if _memory(model, gpu, util, trial).seqs(trial.page_tokens) >= need:
                best, lo = mid, mid + step
            else:
                hi = mid - step
        if best:
            ideas.append(f"max_pixels <= {best:,} (preprocess.max_pixels / --max-pixels)")
    lo, hi, best = 256, budget.max_tokens - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        trial = _Budget(budget.min_pixels, budget.max_pixels, mid, budget.visual, budget.prompt)
        if _memory(model, gpu, util, trial).seqs(trial.page_tokens) >= need:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    if best:
        ideas.append(f"max_tokens <= {best} (--max-tokens)")
    bigger = [
        g.name
        for g in GPUS
        if g.memory_bytes > gpu.memory_bytes and _memory(model, g, util, budget).seqs(budget.page_tokens) >= need
    ]
    if bigger:
        ideas.append("a bigger GPU: " + ", ".join(bigger[:4]))
    split = [
        n
        for n in (2, 4, 8)
        if model.num_attention_heads % n == 0
        and _memory(model, gpu, util, budget, tp=n).seqs(budget.page_tokens) >= need
    ]
    if split:
        ideas.append(f"--gpus {split[0]} (tensor parallel over {split[0]} x {gpu.name})")
    return "; ".join(ideas) if ideas else "nothing in the registry fits this page budget"


def _memory_steps(
    model: ModelSpec, gpu: GpuSpec, util: float, mem: _Memory, budget: _Budget, shards: str
) -> list[Step]:
    act_expr = f"(4 x {model.hidden_size} + 3 x {model.intermediate_size}) x {ACTIVATION_BYTES} B"
    venc = f"(4 x {model.vision_hidden_size} + 3 x {model.vision_intermediate_size}) x {ACTIVATION_BYTES} B"
    return [
        Step(
            "usable_bytes",
            "memory vLLM may use",
            mem.usable,
            "bytes",
            f"{gpu.memory_gib:.2f} GiB x gpu_memory_utilization {util:g} = {gib(mem.usable)} per GPU",
        ),
        Step(
            "weights_bytes",
            "weights",
            mem.weights,
            "bytes",
            f"{model.parameters:,} parameters x {model.dtype_bytes} B ({model.dtype}){shards} = {gib(mem.weights)} "
            f"[{model.sources['parameters']}]",
        ),
        Step(
            "lm_activation_bytes",
            "decoder activation peak (estimate)",
            mem.lm_activation,
            "bytes",
            f"max_num_batched_tokens {mem.batched_tokens} x {act_expr}{shards} = {gib(mem.lm_activation)} "
            "(hidden + residual + attention out, MLP gate/up + activation; one layer live at a time)",
        ),
        Step(
            "encoder_activation_bytes",
            "vision-encoder activation peak (estimate)",
            mem.encoder_activation,
            "bytes",
            f"{budget.visual} visual tokens x {model.merge_size}^2 patches x {venc} = "
            f"{gib(mem.encoder_activation)} (vLLM profiles the encoder on its largest image)",
        ),
        Step(
            "encoder_cache_bytes",
            "encoder cache",
            mem.encoder_cache,
            "bytes",
            f"max({mem.batched_tokens}, {budget.visual}) embeddings x {model.hidden_size} x {ACTIVATION_BYTES} B "
            f"= {gib(mem.encoder_cache)} (v1/core/encoder_cache_manager.py: cache >= one item)",
        ),
        Step(
            "cuda_graph_bytes",
            "CUDA-graph reserve (estimate)",
            CUDA_GRAPH_RESERVE,
            "bytes",
            f"{gib(CUDA_GRAPH_RESERVE)}: decode graphs for batch sizes <= {MAX_NUM_SEQS_CAP} in one pool",
        ),
        Step(
            "cuda_context_bytes",
            "CUDA context reserve (estimate)",
            CUDA_CONTEXT_RESERVE,
            "bytes",
            f"{gib(CUDA_CONTEXT_RESERVE)}: CUDA context, cuBLAS workspaces, NCCL outside PyTorch's allocator",
        ),
        Step(
            "sampler_bytes_per_seq",
            "sampler buffers per sequence",
            mem.sampler_per_seq,
            "bytes",
            f"vocab {model.vocab_size:,} x {SAMPLER_BYTES_PER_LOGIT} B (fp32 logits + probabilities)",
        ),
        Step(
            "kv_bytes_per_token",
            "KV cache per token",
            mem.kv_per_token,
            "bytes",
            f"2 (K,V) x layers x kv_heads x head_dim x {model.dtype_bytes} B = 2 x {model.num_layers} x "
            f"{model.num_kv_heads} x {model.head_dim} x {model.dtype_bytes}{shards} = {mem.kv_per_token:,} B "
            "(PagedAttention, SOSP'23 sec. 3; vLLM AttentionSpec.page_size_bytes)",
        ),
    ]


def _layouts(model: ModelSpec, gpu: GpuSpec, util: float, budget: _Budget, n: int) -> tuple[str, list[Step]]:
    """Compare replicas, tensor and pipeline parallelism over ``n`` GPUs; return the choice and why."""
    page = budget.page_tokens
    single = _memory(model, gpu, util, budget).seqs(page)
    tp_ok = model.num_attention_heads % n == 0 and (model.num_kv_heads % n == 0 or n % model.num_kv_heads == 0)
    tensor = _memory(model, gpu, util, budget, tp=n).seqs(page) if tp_ok else 0
    pipe = _memory(model, gpu, util, budget, pp=n).seqs(page) if model.num_layers >= n else 0
    efficiency = n / (n + n - 1)
    steps = [
        Step(
            "parallel.replicas",
            "data-parallel replicas",
            single * n,
            "seqs",
            f"{n} independent copies x {single} pages each = {single * n} pages in flight; no traffic between "
            "GPUs, throughput scales with n"
            if single
            else "does not fit on one GPU",
        ),
        Step(
            "parallel.tensor",
            f"tensor parallel {n}",
            tensor,
            "seqs",
            f"weights and KV heads split {n} ways: {tensor} pages in flight; 2 all-reduces of the hidden state "
            "per layer per step"
            if tp_ok
            else f"not possible: {model.num_attention_heads} attention / {model.num_kv_heads} KV heads do not "
            f"divide by {n}",
        ),
        Step(
            "parallel.pipeline",
            f"pipeline parallel {n}",
            pipe,
            "seqs",
            f"layers split in {n} stages: {pipe} pages in flight; bubble efficiency m/(m+n-1) = "
            f"{n}/({n}+{n}-1) = {efficiency:.2f} with vLLM's m = n micro-batches in flight",
        ),
    ]
    if single:
        choice, why = (
            "replicas",
            (
                f"the model fits one GPU ({single} pages each): {n} replicas give {n}x the "
                "throughput with no inter-GPU communication, so tensor/pipeline parallelism "
                "would only add all-reduce or pipeline-bubble overhead"
            ),
        )
    elif tensor:
        choice, why = (
            "tensor",
            (
                f"one GPU cannot hold a page; tensor parallelism fits {tensor} pages with no "
                f"pipeline bubble (pipeline efficiency would be {efficiency:.2f})"
            ),
        )
    elif pipe:
        choice, why = "pipeline", f"only a {n}-stage pipeline fits ({pipe} pages), at efficiency {efficiency:.2f}"
    else:
        raise PlanError(
            f"{model.id} does not fit on {n} x {gpu.name} in any layout; " + _suggest(model, gpu, util, budget, 1)
        )
    steps.append(Step("parallel.choice", "multi-GPU layout", choice, "", why))
    return choice, steps


def plan_serving(
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    gpus: int = 1,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    factor: int | None = None,
    max_tokens: int | None = None,
    max_num_seqs: int | None = None,
    p95_seconds: float | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Plan:
    """Plan ``vllm serve`` for ``model`` on ``gpus`` x ``gpu``.

    Args:
        model: the model (registry entry or local checkpoint).
        gpu: the GPU, per device (memory in bytes, bf16 support, bandwidth).
        gpus: number of GPUs.
        gpu_memory_utilization: fraction of each GPU vLLM may use, (0, 1].
        min_pixels: the preprocessor's lower pixel bound (default: the model's).
        max_pixels: the preprocessor's upper pixel bound, px per page (default: the model's).
        factor: the preprocessor's side rounding, px; must be a multiple of the model's.
        max_tokens: output-token budget per page (default: the model recipe's).
        max_num_seqs: a requested batch size; an error if memory allows fewer.
        p95_seconds: latency target; caps ``max_num_seqs`` so the estimated p95 page fits.
        overrides: further vLLM engine arguments in vLLM spelling; ``"auto"`` values are ignored.

    Raises:
        PlanError: the model does not fit (the message says what would), a requested value is
            impossible, or the settings contradict the model.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise PlanError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if gpus < 1:
        raise PlanError(f"--gpus must be >= 1, got {gpus}")
    warnings: list[str] = []
    _check_factor(model, factor, warnings)
    budget = _budget(model, min_pixels, max_pixels, max_tokens)
    if model.max_pixels and budget.max_pixels and budget.max_pixels > model.max_pixels:
        warnings.append(
            f"max_pixels {budget.max_pixels:,} exceeds the model card's {model.max_pixels:,}: "
            "more tokens per page than the model was trained for"
        )
    util = gpu_memory_utilization
    strategy, parallel_steps = ("single", []) if gpus == 1 else _layouts(model, gpu, util, budget, gpus)
    tp = gpus if strategy == "tensor" else 1
    pp = gpus if strategy == "pipeline" else 1
    shards = f" / {tp * pp} GPUs" if tp * pp > 1 else ""
    mem = _memory(model, gpu, util, budget, tp=tp, pp=pp)
    page = budget.page_tokens
    if page > model.max_position_embeddings:
        raise PlanError(
            f"one page needs {page} tokens but {model.id} supports {model.max_position_embeddings}; "
            f"lower max_tokens ({budget.max_tokens}) or max_pixels"
        )

    steps = [
        Step(
            "visual_tokens", "visual tokens per page (max)", budget.visual, "tokens", _visual_derivation(model, budget)
        ),
        Step(
            "prompt_tokens",
            "prompt tokens (estimate)",
            budget.prompt,
            "tokens",
            f"longest task prompt, ceil(UTF-8 bytes / 2) + chat template [{model.sources.get('prompts', '')}]",
        ),
        Step(
            "output_tokens",
            "output budget per page",
            budget.max_tokens,
            "tokens",
            f"max_tokens [{model.sources.get('sampling', '')}]" if max_tokens is None else "max_tokens (given)",
        ),
        Step(
            "page_tokens",
            "tokens per page",
            page,
            "tokens",
            f"{budget.visual} visual + {budget.prompt} prompt + {budget.max_tokens} output = {page}",
        ),
        *_memory_steps(model, gpu, util, mem, budget, shards),
    ]
    fit = mem.seqs(page)
    steps.append(
        Step(
            "seqs_by_memory",
            "pages that fit in KV at once",
            fit,
            "seqs",
            f"floor(({gib(mem.usable)} - {gib(mem.fixed)} fixed) / ({page} tokens x {mem.kv_per_token:,} B "
            f"+ {mem.sampler_per_seq:,} B sampler)) = {fit}",
        )
    )
    if fit < 1:
        if mem.weights >= mem.usable:
            why = f"its weights alone take {gib(mem.weights)} of the {gib(mem.usable)} vLLM may use"
        else:
            why = (
                f"one page needs {gib(page * mem.kv_per_token)} of KV cache but only "
                f"{gib(max(0, mem.usable - mem.fixed))} is left after {gib(mem.fixed)} of weights and reserves"
            )
        raise PlanError(
            f"{model.id} does not fit on {gpu.name} ({gpu.memory_gib:.1f} GiB x {util:g}): {why}. "
            f"What would fit: {_suggest(model, gpu, util, budget, 1)}"
        )
    seqs, why = min(fit, MAX_NUM_SEQS_CAP), f"min(memory {fit}, CUDA-graph cap {MAX_NUM_SEQS_CAP})"
    if p95_seconds is not None:
        cap, derivation = _p95_cap(model, gpu, mem, budget, p95_seconds)
        steps.append(Step("seqs_by_p95", "pages within the p95 target (estimate)", cap, "seqs", derivation))
        seqs, why = min(seqs, cap), why + f", p95 {cap}"
    if max_num_seqs is not None:
        if max_num_seqs > fit:
            raise PlanError(
                f"max_num_seqs={max_num_seqs} does not fit: memory holds {fit} pages of {page} tokens "
                f"on {gpu.name}. What would fit {max_num_seqs}: "
                f"{_suggest(model, gpu, util, budget, max_num_seqs)}"
            )
        seqs, why = max_num_seqs, f"requested {max_num_seqs} (memory allows {fit})"
    kv_tokens = mem.kv_tokens(seqs)
    steps += [
        Step("max_num_seqs", "--max-num-seqs", seqs, "seqs", why + " (per replica)"),
        Step(
            "kv_tokens",
            "KV-cache tokens",
            kv_tokens,
            "tokens",
            f"({gib(mem.usable)} - {gib(mem.fixed)} - {seqs} x sampler) / {mem.kv_per_token:,} B, whole "
            f"{BLOCK_SIZE}-token blocks = {kv_tokens:,}",
        ),
        Step(
            "max_num_batched_tokens",
            "--max-num-batched-tokens",
            mem.batched_tokens,
            "tokens",
            f"max({MIN_BATCHED_TOKENS}, {budget.visual} visual + {budget.prompt} prompt rounded up to "
            f"{BATCHED_TOKENS_ALIGN}); never below one page's prefill, which vLLM rejects at start-up when "
            "chunked multimodal input is off",
        ),
        Step("max_model_len", "--max-model-len", page, "tokens", "one page: visual + prompt + output budget"),
        *parallel_steps,
    ]
    args = _vllm_args(model, gpu, util, budget, seqs, mem.batched_tokens, page, strategy, gpus)
    _apply_overrides(args, overrides or {}, model, mem, budget, kv_tokens, warnings)
    return Plan(model, gpu, gpus, strategy, args, model.vllm_flags, steps, warnings)


def _visual_derivation(model: ModelSpec, budget: _Budget) -> str:
    if not model.supports_pixel_budget:
        t = model.tiles
        cols, rows = geometry.worst_tiling(
            tile_queries=t["tile_queries"], min_crops=t["min_crops"], max_crops=t["max_crops"]
        )
        return (
            f"DeepSeek-OCR Gundam tiling: {geometry.global_view_tokens(t['base_queries'])} global-view tokens "
            f"+ up to {geometry.local_tiles_tokens(cols, rows, t['tile_queries'])} for {cols}x{rows} "
            f"{t['tile_size']}-px tiles [{model.sources['tiles']}]"
        )
    f = model.factor
    if not model.row_tokens:
        extra = f" + {model.image_tokens}" if model.image_tokens else ""
        return (
            f"max_pixels {budget.max_pixels:,} // ({model.patch_size} x {model.merge_size})^2{extra} = "
            f"{budget.max_pixels:,} // {f * f}{extra} [{model.sources['token_formula']}]"
        )
    where = "a square page"
    if model.profile_image:
        height, width = model.profile_image
        where = f"the worse of a square page and vLLM's {width}x{height} profiling image"
    return (
        f"(h/{f}) x (w/{f} + {model.row_tokens}) + {model.image_tokens} at {where}, "
        f"area <= {budget.max_pixels:,} [{model.sources['token_formula']}]"
    )


def _vllm_args(
    model: ModelSpec,
    gpu: GpuSpec,
    util: float,
    budget: _Budget,
    seqs: int,
    batched: int,
    page: int,
    strategy: str,
    gpus: int,
) -> dict[str, object]:
    args: dict[str, object] = {
        "gpu_memory_utilization": util,
        "max_model_len": page,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": batched,
        "limit_mm_per_prompt": {"image": 1},
    }
    if budget.max_pixels is not None:
        args["mm_processor_kwargs"] = {"min_pixels": budget.min_pixels, "max_pixels": budget.max_pixels}
    args["scheduling_policy"] = "priority"
    if not gpu.bf16 and model.dtype == "bfloat16":
        args["dtype"] = "half"
    if strategy == "replicas":
        args["data_parallel_size"] = gpus
    elif strategy == "tensor":
        args["tensor_parallel_size"] = gpus
    elif strategy == "pipeline":
        args["pipeline_parallel_size"] = gpus
    return args


def _apply_overrides(
    args: dict[str, object],
    overrides: Mapping[str, object],
    model: ModelSpec,
    mem: _Memory,
    budget: _Budget,
    kv_tokens: int,
    warnings: list[str],
) -> None:
    """Put the operator's engine arguments into ``args``, refusing what vLLM would refuse or one
    page cannot live with: below one page's tokens, or a ``max_model_len`` above the model's
    positions or the KV cache (vLLM fails its start-up then: ``check_enough_kv_cache_memory`` in
    ``vllm/v1/core/kv_cache_utils.py``)."""
    floors = {"max_num_batched_tokens": budget.visual + budget.prompt, "max_model_len": budget.page_tokens}
    for key, value in overrides.items():
        if value in ("auto", None) or key in ("gpu_memory_utilization", "max_num_seqs"):
            continue
        if key in floors and int(value) < floors[key]:
            raise PlanError(f"vllm.{key}={value} is below the {floors[key]} tokens one page needs")
        if key == "max_model_len":
            _check_model_len(int(value), model, kv_tokens)
        if key == "max_num_batched_tokens" and int(value) > mem.batched_tokens:
            warnings.append(
                f"max_num_batched_tokens={value} raises the activation peak above the planned "
                f"{mem.batched_tokens}; KV estimates may be optimistic"
            )
        args[key] = value


def _check_model_len(value: int, model: ModelSpec, kv_tokens: int) -> None:
    """Refuse a ``max_model_len`` above the model's positions or the planned KV cache, naming
    what fits."""
    fits = min(model.max_position_embeddings, kv_tokens)
    if value > model.max_position_embeddings:
        raise PlanError(
            f"vllm.max_model_len={value:,} is above the {model.max_position_embeddings:,} positions {model.id} "
            f"supports; at most {fits:,} fits"
        )
    if value > kv_tokens:
        raise PlanError(
            f"vllm.max_model_len={value:,} does not fit: the KV cache holds {kv_tokens:,} tokens at the planned "
            f"--max-num-seqs, and vLLM refuses to start with one sequence longer than its cache; at most {fits:,}"
        )
