"""Choosing ``vllm serve`` flags for (GPU, model, pixel budget, output budget), with the work shown.

With vLLM's start-up arithmetic (:mod:`ocrserve.gpu.memory`: what the KV cache will be, given
flags), the planner divides the KV cache by the tokens one page can need (visual tokens at the
pixel budget + prompt + the full output budget) and so sets ``--max-num-seqs`` to the number of
pages that can decode at once without any of them ever being preempted; it sizes the other flags
from the page, picks a multi-GPU layout, checks overrides against what vLLM would refuse and bounds
vLLM's own queue. Every number is kept with its derivation (:class:`Step`) so ``ocrserve plan`` can
show its work. This module returns data (:class:`Plan`, its ``argv`` and ``to_dict``); the
table/yaml/json/argv renderers are the CLI's (:mod:`ocrserve.cli.plan_render`).

Units: bytes for memory, tokens for sequence quantities, seconds for latency. Estimates (activation
peak, reserves, decode speed) are labelled as such; vLLM measures the real values at start-up, and
the planned ``--max-num-seqs`` stays valid as long as the estimates are not below the measurement.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ocrserve.gpu.concurrency import Concurrency, compare
from ocrserve.gpu.host import HostSpec
from ocrserve.gpu.lengths import OutputLengths, prior
from ocrserve.gpu.memory import (
    ACTIVATION_BYTES,
    BATCHED_TOKENS_ALIGN,
    BLOCK_SIZE,
    CUDA_CONTEXT_RESERVE,
    CUDA_GRAPH_RESERVE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    ENCODER_LIVE_LAYERS,
    KV_CACHE_DTYPE_BYTES,
    MIN_BATCHED_TOKENS,
    NCCL_RESERVE,
    NON_TORCH_RESERVE,
    Budget,
    Memory,
    PlanError,
    VllmEngineArgs,
    check_headroom,
    engine_for,
    gib,
    memory_for,
    page_budget,
)
from ocrserve.gpu.overflow import DEFAULT_OVERFLOW_TARGET
from ocrserve.gpu.registry import GPUS, GpuSpec
from ocrserve.gpu.scheduler_model import GpuStepTime
from ocrserve.gpu.vllm_versions import NEWEST, installed_version
from ocrserve.gpu.vllm_versions import release as vllm_release
from ocrserve.models import TEXT, ModelSpec
from ocrserve.preprocess import geometry

MAX_NUM_SEQS_CAP = 512
"""Largest decode batch vLLM captures a CUDA graph for by default (``vllm/config/compilation.py``:
``max_cudagraph_capture_size`` 'capped at 512 by default'); larger batches would run eagerly."""
VIDEO_ARCHITECTURES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm_ocr")
"""``model_type`` families whose vLLM processors also take video: vLLM profiles the encoder with the
modality that costs most tokens unless ``--limit-mm-per-prompt`` sets ``"video": 0``
(``vllm/multimodal/profiling.py``; every modality defaults to 999 items). GLM-OCR: its processor is
GLM-4.1V's, ``Glm4vProcessingInfo.get_supported_mm_limits`` = ``{"image": None, "video": 1}``
(``vllm/model_executor/models/glm4_1v.py``)."""
BANDWIDTH_EFFICIENCY = 0.8
"""Fraction of datasheet DRAM bandwidth a decode step achieves, estimate. A device-to-device copy
reached 4.3 of 4.8 TB/s (0.9) on an H200 here; 0.8 leaves room for kernel overheads."""
P95_OUTPUT_TOKENS = 2048
"""Output tokens of a 95th-percentile page, estimate: a dense A4 page holds ~4,000-6,000 characters,
~1,500-2,000 tokens for these tokenizers; the ``--p95`` estimate uses this, not ``max_tokens``."""


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
        vllm_version: the vLLM release whose start-up accounting the plan follows.
        device: ``"gpu"``, or ``"cpu"`` for vLLM's CPU backend (:mod:`ocrserve.gpu.cpu_planner`),
            where ``gpu`` is the :class:`~ocrserve.gpu.host.HostSpec` and ``strategy`` ``"cpu"``.
        env: environment variables the ``vllm serve`` process needs (the CPU backend's thread
            binding); the launcher sets them on the child.
        concurrency: ``--max-num-seqs`` worst case, statistical and vLLM's default side by side,
            with predictions (:mod:`ocrserve.gpu.concurrency`); None when not asked for.
    """

    model: ModelSpec
    gpu: GpuSpec | HostSpec
    gpus: int
    strategy: str
    vllm_args: dict[str, object]
    extra_flags: tuple[str, ...]
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    vllm_version: str = NEWEST
    device: str = "gpu"
    env: dict[str, str] = field(default_factory=dict)
    concurrency: Concurrency | None = None

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
        arguments, argv, every step and the warnings (a CPU plan: the host and the child's
        environment in place of the GPU); ``ocrserve plan --format json|yaml`` prints it."""
        if self.device == "cpu":
            where = {
                "device": "cpu",
                "host": {
                    "name": self.gpu.name,
                    "available_gib": round(self.gpu.memory_gib, 2),
                    "cpus": len(self.gpu.cpus),
                    "cores": len(self.gpu.cores),
                    "bf16": self.gpu.bf16,
                },
                "env": dict(self.env),
            }
        else:
            where = {
                "gpu": {
                    "name": self.gpu.name,
                    "memory_gib": round(self.gpu.memory_gib, 2),
                    "count": self.gpus,
                    "bf16": self.gpu.bf16,
                }
            }
        return {
            "model": self.model.id,
            **where,
            "strategy": self.strategy,
            "vllm_version": self.vllm_version,
            "vllm_args": dict(self.vllm_args),
            "argv": self.argv(),
            "steps": [
                {"key": s.key, "label": s.label, "value": s.value, "unit": s.unit, "derivation": s.derivation}
                for s in self.steps
            ],
            "warnings": list(self.warnings),
            **({"concurrency": self.concurrency.to_dict()} if self.concurrency else {}),
        }


def check_factor(model: ModelSpec, factor: int | None, warnings: list[str]) -> None:
    """Check ``preprocess.factor`` against the model's patch x merge factor (a multiple of it).

    Raises:
        PlanError: not a multiple, so vLLM would resize every page again.
    """
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


def _p95_cap(model: ModelSpec, gpu: GpuSpec, mem: Memory, budget: Budget, target: float) -> tuple[int, str]:
    """Largest batch whose estimated p95 page latency fits ``target`` seconds.

    Decoding is memory-bound: each step streams the weights once and every running sequence's KV
    cache. ``step(B) = (weights + B x ctx x kv/token) / (bandwidth x efficiency)`` with ``ctx`` the
    mean context while a p95 page decodes (visual + prompt + half its output); a page takes
    ``P95_OUTPUT_TOKENS x step(B)``. Prefill (one compute-bound pass over the page's visual tokens,
    typically well under 10% of an OCR page's time) is not modelled.
    """
    if not math.isfinite(target):
        raise PlanError(f"--p95 must be a finite number of seconds, got {target}")
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


def _suggest(model: ModelSpec, gpu: GpuSpec, util: float, budget: Budget, engine: VllmEngineArgs, need: int) -> str:
    """What would fit ``need`` pages at once: a smaller pixel budget, a smaller output budget, or a GPU."""
    ideas = []
    if model.supports_pixel_budget and budget.max_pixels:
        step = model.factor**2
        lo, hi = step * 4, budget.max_pixels
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2 // step * step
            floor = min(budget.min_pixels or mid, mid)
            trial = Budget(floor, mid, budget.max_tokens, model.max_visual_tokens(floor, mid), budget.prompt)
            if memory_for(model, gpu, util, trial, engine).seqs(trial.page_tokens) >= need:
                best, lo = mid, mid + step
            else:
                hi = mid - step
        if best:
            ideas.append(f"max_pixels <= {best:,} (preprocess.max_pixels / --max-pixels)")
    lo, hi, best = 256, budget.max_tokens - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        trial = Budget(budget.min_pixels, budget.max_pixels, mid, budget.visual, budget.prompt)
        if memory_for(model, gpu, util, trial, engine).seqs(trial.page_tokens) >= need:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    if best:
        ideas.append(f"max_tokens <= {best} (--max-tokens)")
    bigger = [
        g.name
        for g in GPUS
        if g.memory_bytes > gpu.memory_bytes
        and memory_for(model, g, util, budget, engine).seqs(budget.page_tokens) >= need
    ]
    if bigger:
        ideas.append("a bigger GPU: " + ", ".join(bigger[:4]))
    split = [
        n
        for n in (2, 4, 8)
        if model.num_attention_heads % n == 0
        and memory_for(model, gpu, util, budget, engine, tp=n).seqs(budget.page_tokens) >= need
    ]
    if split:
        ideas.append(f"--gpus {split[0]} (tensor parallel over {split[0]} x {gpu.name})")
    return "; ".join(ideas) if ideas else "nothing in the registry fits this page budget"


def weights_derivation(model: ModelSpec, shards: str) -> str:
    """How the weights' bytes were found, for the plan's table (``shards``: e.g. ``" / 2 GPUs"``)."""
    if model.weight_bytes:
        how = model.quantization or model.dtype
        return f"{model.weight_bytes:,} B ({how}){shards} [{model.sources.get('weight_bytes', '')}]"
    return (
        f"{model.parameters:,} parameters x {model.dtype_bytes} B ({model.dtype}){shards} "
        f"[{model.sources['parameters']}]"
    )


def _memory_steps(
    model: ModelSpec,
    gpu: GpuSpec,
    util: float,
    mem: Memory,
    budget: Budget,
    engine: VllmEngineArgs,
    seqs: int,
    shards: str,
) -> list[Step]:
    act_expr = f"(4 x {model.hidden_size} + 3 x {model.intermediate_size}) x {ACTIVATION_BYTES} B"
    venc = f"(4 x {model.vision_hidden_size} + 3 x {model.vision_intermediate_size}) x {ACTIVATION_BYTES} B"
    items = max(1, min(mem.encoder_pages, seqs))
    release = engine.accounting.name
    sampled = min(seqs, mem.batched_tokens)
    nccl = (
        f" + NCCL {gib(NCCL_RESERVE)} (charged by vLLM {release})" if shards and engine.accounting.charges_nccl else ""
    )
    late_graphs = not (engine.enforce_eager or engine.accounting.charges_cuda_graphs)
    kv_bytes = KV_CACHE_DTYPE_BYTES[engine.kv_cache_dtype] or model.dtype_bytes
    graphs = (
        f"charged: vLLM {release} estimates the graph pool before sizing the KV cache"
        if engine.graphs_charged
        else "not charged here"
        + (" (--enforce-eager: no graphs)" if engine.enforce_eager else f": vLLM {release} captures graphs later")
    )
    return [
        Step(
            "usable_bytes",
            "memory vLLM may use",
            mem.usable,
            "bytes",
            f"{gpu.memory_gib:.2f} GiB (as CUDA reports it) x gpu_memory_utilization {util:g} = {gib(mem.usable)} "
            "per GPU",
        ),
        Step("weights_bytes", "weights", mem.weights, "bytes", weights_derivation(model, shards)),
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
            mem.encoder_activation(seqs),
            "bytes",
            f"{ENCODER_LIVE_LAYERS} layers x {items} page(s) x {budget.visual} visual tokens x {model.merge_size}^2 "
            f"patches x {venc} = "
            f"{gib(mem.encoder_activation(seqs))} (vLLM profiles min(max_num_seqs, its encoder budget "
            f"max({mem.batched_tokens}, {budget.visual}) tokens / one page) of its largest image)",
        ),
        Step(
            "sampler_bytes_per_seq",
            "sampler buffers per sequence",
            mem.sampler_per_seq,
            "bytes",
            f"vocab {model.vocab_size:,} x {engine.sampler_bytes_per_logit} B ({engine.sampler} top-k/top-p); the "
            f"profile samples {sampled} sequences: {gib(sampled * mem.sampler_per_seq)}",
        ),
        Step(
            "activation_bytes",
            "profile-run peak (estimate)",
            mem.activation(seqs),
            "bytes",
            "max(decoder, encoder, sampler): the passes of vLLM's profile_run run one after another",
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
            "reserve_bytes",
            "non-torch, NCCL and CUDA-graph reserves (estimate)",
            mem.reserves,
            "bytes",
            f"non-torch {gib(NON_TORCH_RESERVE)}"
            + nccl
            + f" + CUDA graphs {gib(CUDA_GRAPH_RESERVE) if engine.graphs_charged else '0'} ({graphs})",
        ),
        Step(
            "cuda_context_bytes",
            "headroom outside gpu_memory_utilization (estimate)",
            engine.headroom_needed(),
            "bytes",
            f"CUDA context {gib(CUDA_CONTEXT_RESERVE)}"
            + (f" + CUDA graphs {gib(CUDA_GRAPH_RESERVE)}" if late_graphs else "")
            + f"; must fit in {gpu.memory_gib:.2f} GiB x (1 - {util:g}) = {gib(gpu.memory_bytes * (1 - util))}, "
            "not charged to the KV cache",
        ),
        Step(
            "kv_bytes_per_token",
            "KV cache per token",
            mem.kv_per_token,
            "bytes",
            f"2 (K,V) x layers x kv_heads x head_dim x {kv_bytes} B (kv_cache_dtype {engine.kv_cache_dtype}) = 2 x "
            f"{model.num_layers} x {model.num_kv_heads} x {model.head_dim} x {kv_bytes}{shards} = "
            f"{mem.kv_per_token:,} B (PagedAttention, SOSP'23 sec. 3; vLLM AttentionSpec.page_size_bytes)",
        ),
    ]


def _layouts(
    model: ModelSpec, gpu: GpuSpec, util: float, budget: Budget, engine: VllmEngineArgs, n: int
) -> tuple[str, list[Step]]:
    """Compare replicas, tensor and pipeline parallelism over ``n`` GPUs; return the choice and why."""
    page = budget.page_tokens
    single = memory_for(model, gpu, util, budget, engine).seqs(page)
    tp_ok = model.num_attention_heads % n == 0 and (model.num_kv_heads % n == 0 or n % model.num_kv_heads == 0)
    tensor = memory_for(model, gpu, util, budget, engine, tp=n).seqs(page) if tp_ok else 0
    pipe = memory_for(model, gpu, util, budget, engine, pp=n).seqs(page) if model.num_layers >= n else 0
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
            f"{model.id} does not fit on {n} x {gpu.name} in any layout; "
            + _suggest(model, gpu, util, budget, engine, 1)
        )
    steps.append(Step("parallel.choice", "multi-GPU layout", choice, "", why))
    return choice, steps


def _check_gpu_arguments(gpu_memory_utilization: float, gpus: int, overrides: Mapping[str, object]) -> None:
    """Refuse arguments no GPU plan takes.

    Raises:
        PlanError: a utilization outside (0, 1], fewer than one GPU, or a CPU-only KV-cache size.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise PlanError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if gpus < 1:
        raise PlanError(f"--gpus must be >= 1, got {gpus}")
    if overrides.get("kv_cache_memory_bytes") not in (None, "auto"):
        raise PlanError(
            "vllm.kv_cache_memory_bytes is planned for vLLM's CPU backend (vllm.device=cpu); on a GPU the planner "
            "sizes the KV cache from gpu_memory_utilization"
        )


def _does_not_fit(
    model: ModelSpec, gpu: GpuSpec, util: float, budget: Budget, engine: VllmEngineArgs, mem: Memory
) -> PlanError:
    """The error for a model of which not one page fits: why, and what would fit."""
    if mem.weights >= mem.usable:
        why = f"its weights alone take {gib(mem.weights)} of the {gib(mem.usable)} vLLM may use"
    else:
        left = max(0, mem.usable - mem.non_kv(1))
        why = (
            f"one page needs {gib(budget.page_tokens * mem.kv_per_token)} of KV cache but only {gib(left)} is left "
            f"after {gib(mem.non_kv(1))} of weights, profile peak and reserves"
        )
    return PlanError(
        f"{model.id} does not fit on {gpu.name} ({gpu.memory_gib:.1f} GiB x {util:g}): {why}. "
        f"What would fit: {_suggest(model, gpu, util, budget, engine, 1)}"
    )


def _speculative_config(spec: Mapping[str, object]) -> dict[str, object]:
    """vLLM's ``--speculative-config`` from a registry entry's ``speculative`` mapping."""
    return {
        "method": spec["method"],
        **({"model": spec["model"]} if spec.get("model") else {}),
        "num_speculative_tokens": spec["num_speculative_tokens"],
    }


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
    vllm_version: str | None = None,
    gateway_overcommit: float = 1.0,
    gateway_burst: int = 0,
    output_lengths: OutputLengths | None = None,
    overflow_target: float | None = None,
    speculative: bool = False,
    predict: bool = False,
    task: str = "text",
) -> Plan:
    """Plan ``vllm serve`` for ``model`` on ``gpus`` x ``gpu`` with the start-up accounting of
    ``vllm_version``.

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
            ``max_num_batched_tokens``, ``kv_cache_dtype`` and ``enforce_eager`` enter the memory
            arithmetic.
        vllm_version: the release planned for (``None``: the installed one, else
            :data:`~ocrserve.gpu.vllm_versions.NEWEST`).
        gateway_overcommit, gateway_burst: the gateway keeps ``ceil(max_num_seqs x overcommit) +
            burst`` pages in flight (``router.slot_overcommit``, ``router.fast.burst_slots``); that
            sizes ``--max-num-queued-reqs`` where the release has it.
        output_lengths: the output-length model (:mod:`ocrserve.gpu.lengths`); given, or with
            ``overflow_target``, the plan compares worst-case, statistical and vLLM's default
            ``--max-num-seqs`` (``Plan.concurrency``); None with a target: the registry's prior
            for ``task``.
        overflow_target: chance that the running pages outgrow the KV cache the plan accepts;
            given, ``--max-num-seqs`` is the statistical ``N`` instead of the worst case.
        speculative: emit ``--speculative-config`` from the model's registry entry, with the
            draft's weights and KV in the memory arithmetic.
        predict: run the scheduler model for each compared ``N`` (pages/s, p95, preemptions).
        task: the task whose prior is used when no ``output_lengths`` is given.

    Raises:
        PlanError: the model does not fit (the message says what would), a requested value is
            impossible, the settings contradict the model, or the release is not one the planner
            follows.
    """
    _check_gpu_arguments(gpu_memory_utilization, gpus, overrides or {})
    warnings: list[str] = []
    check_factor(model, factor, warnings)
    engine = engine_for(vllm_version, overrides or {})
    check_release(model, engine, warnings)
    model = _with_dtype(model, gpu, (overrides or {}).get("dtype"))
    check_headroom(gpu, gpu_memory_utilization, engine)
    budget = page_budget(model, min_pixels, max_pixels, max_tokens)
    served, draft_steps, lookahead = model, [], 0
    if speculative:
        model, draft_steps, lookahead = _with_draft(model)
    if model.max_pixels and budget.max_pixels and budget.max_pixels > model.max_pixels:
        warnings.append(
            f"max_pixels {budget.max_pixels:,} exceeds the model card's {model.max_pixels:,}: "
            "more tokens per page than the model was trained for"
        )
    util = gpu_memory_utilization
    strategy, parallel_steps = ("single", []) if gpus == 1 else _layouts(model, gpu, util, budget, engine, gpus)
    tp = gpus if strategy == "tensor" else 1
    pp = gpus if strategy == "pipeline" else 1
    shards = f" / {tp * pp} GPUs" if tp * pp > 1 else ""
    mem = memory_for(model, gpu, util, budget, engine, tp=tp, pp=pp)
    page = budget.page_tokens
    if page > model.max_position_embeddings:
        raise PlanError(
            f"one page needs {page} tokens but {model.id} supports {model.max_position_embeddings}; "
            f"lower max_tokens ({budget.max_tokens}) or max_pixels"
        )

    steps = page_steps(model, budget, engine, vllm_version, max_tokens_given=max_tokens is not None)
    fit = mem.seqs(page)
    steps.append(
        Step(
            "seqs_by_memory",
            "pages that fit in KV at once",
            fit,
            "seqs",
            f"largest s with ({gib(mem.usable)} - non-KV(s)) / {mem.kv_per_token:,} B >= s x {page} tokens, "
            f"non-KV(s) = weights + profile peak(s) + encoder cache + reserves = {gib(mem.non_kv(max(fit, 1)))} "
            f"at s = {max(fit, 1)}: {fit}",
        )
    )
    if fit < 1:
        raise _does_not_fit(model, gpu, util, budget, engine, mem)
    seqs, why = min(fit, MAX_NUM_SEQS_CAP), f"min(memory {fit}, CUDA-graph cap {MAX_NUM_SEQS_CAP})"
    if p95_seconds is not None:
        cap, derivation = _p95_cap(model, gpu, mem, budget, p95_seconds)
        steps.append(Step("seqs_by_p95", "pages within the p95 target (estimate)", cap, "seqs", derivation))
        seqs, why = min(seqs, cap), why + f", p95 {cap}"
    concurrency = None
    if output_lengths is not None or overflow_target is not None:
        target = DEFAULT_OVERFLOW_TARGET if overflow_target is None else overflow_target
        if not 0 <= target < 1:
            raise PlanError(f"--overflow / vllm.kv_overflow_target must be in [0, 1), got {target}")
        lengths = output_lengths or prior(
            served.id, task, served.output_tokens, served.sources.get("output_tokens", "")
        )
        step_time = None
        if predict and gpu.bandwidth_bytes_per_s > 0:
            step_time = GpuStepTime(
                mem.weights, mem.kv_per_token, model.parameters, gpu.bandwidth_bytes_per_s * BANDWIDTH_EFFICIENCY
            )
        concurrency = compare(
            mem,
            budget,
            lengths,
            target,
            worst_case=min(fit, MAX_NUM_SEQS_CAP),
            vllm_default=engine.accounting.default_batch(gpu)[0],
            cap=MAX_NUM_SEQS_CAP,
            lookahead=lookahead,
            step_time=step_time,
            speedup=[(int(c), s) for c, s in (served.speculative or {}).get("speedup", [])] if speculative else (),
        )
        steps += _concurrency_steps(concurrency, budget, target)
        if predict and step_time is None:
            warnings.append(f"no predicted pages/s: {gpu.name}'s memory bandwidth is unknown (name a registry GPU)")
        if overflow_target is not None:
            chosen = concurrency.candidate("statistical")
            seqs, why = (
                chosen.seqs,
                (
                    f"statistical: P(overflow) {chosen.overflow:.2%} <= {target:g} (worst case {fit}, CUDA-graph cap "
                    f"{MAX_NUM_SEQS_CAP})"
                ),
            )
            if seqs < 1:
                raise PlanError(f"no --max-num-seqs keeps the overflow chance within {target:g}: raise --overflow")
    if max_num_seqs is not None:
        if max_num_seqs > fit and overflow_target is None:
            raise PlanError(
                f"max_num_seqs={max_num_seqs} does not fit: memory holds {fit} pages of {page} tokens "
                f"on {gpu.name}. What would fit {max_num_seqs}: "
                f"{_suggest(model, gpu, util, budget, engine, max_num_seqs)}"
            )
        seqs, why = max_num_seqs, f"requested {max_num_seqs} (memory allows {fit})"
    kv_tokens = mem.kv_tokens(seqs)
    first = 5  # the release and the page's tokens (page_steps) come first, then the memory that holds them
    steps[first:first] = _memory_steps(model, gpu, util, mem, budget, engine, seqs, shards)
    steps += [
        Step("max_num_seqs", "--max-num-seqs", seqs, "seqs", why + " (per replica)"),
        Step(
            "kv_tokens",
            "KV-cache tokens",
            kv_tokens,
            "tokens",
            f"({gib(mem.usable)} - {gib(mem.non_kv(seqs))} non-KV) / {mem.kv_per_token:,} B, whole "
            f"{BLOCK_SIZE}-token blocks = {kv_tokens:,} (vLLM's 'GPU KV cache size')",
        ),
        Step(
            "max_num_batched_tokens",
            "--max-num-batched-tokens",
            mem.batched_tokens,
            "tokens",
            "given (vllm.max_num_batched_tokens)"
            if engine.max_num_batched_tokens
            else f"max({MIN_BATCHED_TOKENS}, {budget.visual} visual + {budget.prompt} prompt rounded up to "
            f"{BATCHED_TOKENS_ALIGN}); never below one page's prefill, which vLLM rejects at start-up when "
            "chunked multimodal input is off",
        ),
        Step("max_model_len", "--max-model-len", page, "tokens", "one page: visual + prompt + output budget"),
        *parallel_steps,
    ]
    steps += draft_steps
    args = _vllm_args(model, gpu, util, budget, seqs, mem.batched_tokens, page, strategy, gpus)
    if speculative:
        args["speculative_config"] = _speculative_config(served.speculative)
    in_flight = math.ceil(seqs * (gpus if strategy == "replicas" else 1) * gateway_overcommit) + gateway_burst
    steps += admission_steps(args, engine, budget, in_flight)
    _apply_overrides(args, overrides or {}, model, budget, kv_tokens)
    return Plan(
        served,
        gpu,
        gpus,
        strategy,
        args,
        served.vllm_flags,
        steps,
        warnings,
        engine.accounting.name,
        concurrency=concurrency,
    )


def _with_draft(model: ModelSpec) -> tuple[ModelSpec, list[Step], int]:
    """``model`` with its speculative draft's weights and KV layers added, the step that says so,
    and the tokens each running request reserves for the proposals (vLLM's ``allocate_slots``
    ``num_lookahead_tokens`` = ``num_speculative_tokens``).

    Raises:
        PlanError: the registry entry records no speculative decoder.
    """
    spec = model.speculative
    if not spec:
        raise PlanError(
            f"vllm.speculative: {model.id}'s registry entry records no speculative decoder (draft or MTP head)"
        )
    k = int(spec["num_speculative_tokens"])
    extra_params, extra_layers = int(spec.get("parameters", 0)), int(spec.get("kv_layers", 0))
    with_draft = model.with_overrides(
        parameters=model.parameters + extra_params, num_layers=model.num_layers + extra_layers
    )
    gains = ", ".join(f"{s:g}x at {int(c)}" for c, s in spec.get("speedup", []))
    step = Step(
        "speculative",
        "speculative decoding",
        f"{spec['method']}" + (f" ({spec['model']})" if spec.get("model") else ""),
        "",
        f"--speculative-config method {spec['method']}, {k} tokens proposed a step; the draft adds "
        f"{extra_params:,} parameters to the weights and {extra_layers} layer(s) to the KV per token, and "
        f"each running page reserves {k} lookahead slots; reported speedup {gains or 'none'}: the gain falls "
        f"as the batch grows (verification is batched with every other page) "
        f"[{model.sources.get('speculative', '')}]",
    )
    return with_draft, [step], k


def _concurrency_steps(c: Concurrency, budget: Budget, target: float) -> list[Step]:
    """The plan's rows for the output-length model and the statistical ``--max-num-seqs``."""
    stat = c.candidate("statistical")
    worst = c.candidate("worst case")
    return [
        Step("output_lengths", "output-length model", c.lengths.kind, "", c.lengths.describe(budget.max_tokens)),
        Step(
            "seqs_statistical",
            "pages at once, statistical",
            stat.seqs,
            "seqs",
            f"largest N with P(N pages' KV blocks > cache) <= {target:g}: N = {c.by_chance} (exact: N-fold "
            f"convolution of one page's blocks, ceil((visual + prompt + output) / {BLOCK_SIZE}), all N at their "
            f"final lengths), and with at most {target:g} of pages preempted in the scheduler model (3 runs): "
            f"N = {stat.seqs}, P(overflow) {stat.overflow:.3%}; worst case {worst.seqs}. max_tokens stays "
            f"{budget.max_tokens}: a long page is never cut; an overflow preempts the newest page, which later "
            "recomputes its prefill "
            "(vllm/v1/core/sched/scheduler.py _preempt_request)",
        ),
    ]


def page_steps(
    model: ModelSpec, budget: Budget, engine: VllmEngineArgs, vllm_version: str | None, *, max_tokens_given: bool
) -> list[Step]:
    """The plan's first steps, alike for a GPU and a CPU host: the vLLM release planned for, then one
    page's tokens (visual at the pixel budget, prompt, output budget, and their sum).

    Args:
        model, budget, engine: the model, its page budget and the vLLM release's engine arguments.
        vllm_version: the release asked for (``--vllm-version``), None for the installed or newest.
        max_tokens_given: whether the output budget was given rather than the model recipe's.
    """
    return [
        Step(
            "vllm_version",
            "vLLM planned for",
            engine.accounting.name,
            "",
            "the installed vLLM"
            if vllm_version is None and installed_version()
            else "--vllm-version / vllm.version"
            if vllm_version
            else f"vLLM is not installed here: the newest release the planner knows ({NEWEST})",
        ),
        Step(
            "visual_tokens", "visual tokens per page (max)", budget.visual, "tokens", visual_derivation(model, budget)
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
            "max_tokens (given)" if max_tokens_given else f"max_tokens [{model.sources.get('sampling', '')}]",
        ),
        Step(
            "page_tokens",
            "tokens per page",
            budget.page_tokens,
            "tokens",
            f"{budget.visual} visual + {budget.prompt} prompt + {budget.max_tokens} output = {budget.page_tokens}",
        ),
    ]


def visual_derivation(model: ModelSpec, budget: Budget) -> str:
    """How a page's visual tokens follow from the pixel budget, for the plan's table."""
    if model.token_formula == TEXT:
        return "a text-only model: no image"
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
    budget: Budget,
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
    }
    if model.token_formula != TEXT:
        video = {"video": 0} if model.architecture in VIDEO_ARCHITECTURES else {}
        args["limit_mm_per_prompt"] = {"image": 1, **video}
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
    budget: Budget,
    kv_tokens: int,
) -> None:
    """Put the operator's engine arguments into ``args``, refusing what vLLM would refuse or one
    page cannot live with: below one page's tokens, or a ``max_model_len`` above the model's
    positions or the KV cache (vLLM fails its start-up then: ``check_enough_kv_cache_memory`` in
    ``vllm/v1/core/kv_cache_utils.py``)."""
    floors = {"max_num_batched_tokens": budget.visual + budget.prompt, "max_model_len": budget.page_tokens}
    for key, value in overrides.items():
        if value in ("auto", None) or value is False or key in ("gpu_memory_utilization", "max_num_seqs"):
            continue  # False: a switch left off
        if key in floors and int(value) < floors[key]:
            raise PlanError(f"vllm.{key}={value} is below the {floors[key]} tokens one page needs")
        if key == "max_model_len":
            _check_model_len(int(value), model, kv_tokens)
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


def admission_steps(args: dict[str, object], engine: VllmEngineArgs, budget: Budget, in_flight: int) -> list[Step]:
    """Bound vLLM's own queue where the release can (``--max-num-queued-reqs`` counts waiting and
    running requests, ``--max-num-queued-tokens`` prompt tokens in prefill; over either vLLM answers
    503, which the gateway takes as backpressure): to the pages the gateway keeps in flight."""
    if not engine.accounting.queue_limits:
        return [
            Step(
                "max_num_queued_reqs",
                "vLLM's queue bound",
                "none",
                "",
                f"vLLM {engine.accounting.name} has no --max-num-queued-reqs (since 0.29.0); the gateway's lanes "
                "bound what it sends",
            )
        ]
    reqs = in_flight
    tokens = reqs * (budget.visual + budget.prompt)
    args["max_num_queued_reqs"] = reqs
    args["max_num_queued_tokens"] = tokens
    return [
        Step(
            "max_num_queued_reqs",
            "--max-num-queued-reqs",
            reqs,
            "seqs",
            "the pages the gateway keeps in flight (max_num_seqs x router.slot_overcommit + "
            "router.fast.burst_slots); beyond them (another client) vLLM answers 503 at once instead of queueing",
        ),
        Step(
            "max_num_queued_tokens",
            "--max-num-queued-tokens",
            tokens,
            "tokens",
            f"{reqs} pages x ({budget.visual} visual + {budget.prompt} prompt) prefill tokens",
        ),
    ]


def check_release(model: ModelSpec, engine: VllmEngineArgs, warnings: list[str]) -> None:
    """Refuse a release older than the model needs (the registry's ``min_vllm``); warn about one
    newer than the planner has read (its rules are taken as the newest's)."""
    release = engine.accounting.version
    if release < vllm_release(model.min_vllm):
        raise PlanError(
            f"{model.id} needs vLLM >= {model.min_vllm} [{model.sources.get('min_vllm', 'registry')}]; "
            f"planning for {engine.accounting.name}"
        )
    if release > vllm_release(NEWEST):
        warnings.append(
            f"vLLM {engine.accounting.name} is newer than {NEWEST}, the newest release the planner has read; "
            f"planned with {NEWEST}'s start-up accounting"
        )


def _with_dtype(model: ModelSpec, gpu: GpuSpec, dtype: object) -> ModelSpec:
    """``model`` as ``--dtype`` loads it: ``float32``/``float`` doubles an unquantized bf16 model's
    weights and KV bytes; ``bfloat16`` on a GPU without it is what vLLM refuses
    (``vllm/platforms/cuda.py`` ``check_if_supports_dtype``)."""
    if dtype in (None, "auto", "half", "float16"):
        return model
    if dtype == "bfloat16" and not gpu.bf16:
        raise PlanError(f"vllm.dtype=bfloat16: {gpu.name} has no bfloat16 (compute capability below 8.0); use half")
    if dtype in ("float32", "float") and not model.quantization:
        return model.with_overrides(dtype="float32", weight_bytes=0)
    return model
