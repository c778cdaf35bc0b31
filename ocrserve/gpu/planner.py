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
from dataclasses import dataclass, field, replace

from ocrserve.gpu.registry import GIB, GPUS, GpuSpec
from ocrserve.gpu.vllm_versions import NEWEST, Accounting, VersionError, accounting_for, installed_version
from ocrserve.models import TEXT, ModelSpec
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
"""Estimate, bytes: the CUDA-graph pool. vLLM captures decode graphs for batch sizes up to 512 in
one shared pool; start-up logs show 0.13 GiB (a 1B model) to 0.50 GiB (Qwen2-7B on one A100, vLLM
0.10.1.1: 'Graph capturing finished in 3 secs, took 0.50 GiB') and 0.65 GiB for the same at
tensor parallel 2. Charged to the KV cache where the target release estimates graphs before sizing
it (:attr:`~ocrserve.gpu.vllm_versions.Accounting.charges_cuda_graphs`), else it must fit in the
``1 - gpu_memory_utilization`` headroom."""
CUDA_CONTEXT_RESERVE = GIB // 2
"""Estimate, bytes: the CUDA context (plus cuBLAS handles) created before vLLM's memory snapshot,
typically 300-500 MiB on current drivers (PyTorch 'CUDA semantics' notes). vLLM does not charge it
to the KV cache, but it must fit in ``total x (1 - gpu_memory_utilization)``: vLLM refuses to start
when free memory after it is below ``total x gpu_memory_utilization`` (``request_memory``,
``vllm/v1/worker/utils.py``)."""
NON_TORCH_RESERVE = 3 * GIB // 10
"""Estimate, bytes: memory outside PyTorch's allocator that grows after vLLM's snapshot (cuBLAS and
attention-backend workspaces), charged to the KV cache as ``non_torch_increase``
(``vllm/utils/mem_utils.py`` ``memory_profiling``). Calibrated on vLLM 0.10.1.1 start-up logs of
Qwen2-7B-Instruct on an A100 80GB (``tests/data/vllm_startup_logs.json``): requested - weights -
available KV = 0.556 GiB at both 0.25 and 0.5 utilization, of which the profile's sampler peak
(256 x 152,064 logits x 8 B) is 0.29 GiB."""
NCCL_RESERVE = GIB // 8
"""Estimate, bytes: NCCL and custom all-reduce buffers at tensor/pipeline parallel > 1, charged to
the KV cache by releases that snapshot memory before initializing them
(:attr:`~ocrserve.gpu.vllm_versions.Accounting.charges_nccl`). The same logs at tensor parallel 2
show 0.117 GiB more non-KV memory per GPU than at 1."""
ENCODER_LIVE_LAYERS = 2
"""Vision-encoder layers' working sets alive at the profile's peak, estimate: vLLM keeps the dummy
encoder outputs of every patch while the next layer runs. Calibrated on the one multimodal start-up
log with a known model and GPU (dots.ocr on an RTX 3090, vLLM 0.11.1, one 14,400-token image
profiled): 4.06 GiB of profile peak where one layer's working set, ``patches x (4 x hidden + 3 x
intermediate) x 2 B``, is 2.02 GiB."""
ACTIVATION_BYTES = 2
"""Activations are computed in the model dtype (bf16/fp16: 2 bytes)."""
SAMPLER_BYTES_PER_LOGIT = 8
"""Sampler with FlashInfer's top-k/top-p kernels, bytes per vocabulary entry per sequence: fp32
logits (4) plus fp32 probabilities (4) (vLLM's sampler upcasts logits to float32 before softmax,
``vllm/v1/sample/sampler.py``). vLLM's profile run samples ``min(max_num_batched_tokens,
max_num_seqs)`` dummy sequences (``gpu_model_runner.py`` ``_dummy_sampler_run``), so this peak
grows with ``--max-num-seqs``. Fits the 0.10.1.1 logs that say "Using FlashInfer for top-p & top-k
sampling" (``tests/data/vllm_startup_logs.json``)."""
NATIVE_SAMPLER_BYTES_PER_LOGIT = 32
"""The same with PyTorch's own top-k/top-p (``topk_topp_sampler.py`` ``forward_native``, used where
vLLM logs "FlashInfer is not available"): a sort of the logits adds fp32 values, int64 indices and
the cumulative probabilities. Estimate: fitted on the start-up logs that print that warning (256
sequences: 30-31 B per logit; 1024 sequences: up to 50), rounded down to keep 128-sequence logs
within 10%. The planner plans with it, as it cannot know which the target has."""
KV_CACHE_DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
"""Bytes per KV element of each ``--kv-cache-dtype`` (``None``: the model's dtype); fp8 is stored as
uint8 (``vllm/utils/torch_utils.py`` ``STR_DTYPE_TO_TORCH_DTYPE``)."""
VIDEO_ARCHITECTURES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
"""``model_type`` families whose vLLM processors also take video: vLLM profiles the encoder with the
modality that costs most tokens unless ``--limit-mm-per-prompt`` sets ``"video": 0``
(``vllm/multimodal/profiling.py``; every modality defaults to 999 items)."""
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
        vllm_version: the vLLM release whose start-up accounting the plan follows.
    """

    model: ModelSpec
    gpu: GpuSpec
    gpus: int
    strategy: str
    vllm_args: dict[str, object]
    extra_flags: tuple[str, ...]
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    vllm_version: str = NEWEST

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
            "vllm_version": self.vllm_version,
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
class Engine:
    """What the planned ``vllm serve`` is, beyond the model and the GPU.

    Attributes:
        accounting: the target release's start-up rules (:mod:`ocrserve.gpu.vllm_versions`).
        kv_cache_dtype: ``--kv-cache-dtype`` (a key of :data:`KV_CACHE_DTYPE_BYTES`).
        enforce_eager: ``--enforce-eager``: no CUDA graphs.
        max_num_batched_tokens: a given ``--max-num-batched-tokens``; ``None`` = the planner's.
        flashinfer_sampler: vLLM samples with FlashInfer's top-k/top-p kernels (a smaller profile
            peak); the planner assumes not.
    """

    accounting: Accounting
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    max_num_batched_tokens: int | None = None
    flashinfer_sampler: bool = False

    @property
    def sampler(self) -> str:
        return "FlashInfer" if self.flashinfer_sampler else "PyTorch"

    @property
    def sampler_bytes_per_logit(self) -> int:
        """:data:`SAMPLER_BYTES_PER_LOGIT` with FlashInfer's sampler, else :data:`NATIVE_SAMPLER_BYTES_PER_LOGIT`."""
        return SAMPLER_BYTES_PER_LOGIT if self.flashinfer_sampler else NATIVE_SAMPLER_BYTES_PER_LOGIT

    def reserves(self, shards: int) -> int:
        """Bytes the release charges to the KV cache besides weights and the profile's peak:
        :data:`NON_TORCH_RESERVE`, plus :data:`NCCL_RESERVE` across GPUs where it is charged, plus
        :data:`CUDA_GRAPH_RESERVE` where graphs are estimated before the KV cache."""
        nccl = NCCL_RESERVE if shards > 1 and self.accounting.charges_nccl else 0
        return NON_TORCH_RESERVE + nccl + self.graphs_charged * CUDA_GRAPH_RESERVE

    @property
    def graphs_charged(self) -> bool:
        """Whether CUDA graphs are captured and charged to the KV cache."""
        return self.accounting.charges_cuda_graphs and not self.enforce_eager

    def headroom_needed(self) -> int:
        """Bytes that must stay outside ``gpu_memory_utilization``: the CUDA context, and the graph
        pool where the release captures graphs after sizing the KV cache."""
        late_graphs = not self.enforce_eager and not self.accounting.charges_cuda_graphs
        return CUDA_CONTEXT_RESERVE + late_graphs * CUDA_GRAPH_RESERVE


@dataclass(frozen=True)
class _Memory:
    """Per-GPU memory arithmetic for one layout (tensor x pipeline shards), as vLLM's
    ``determine_available_memory`` does it: usable = total x utilization, minus weights, the
    profile run's peak, the encoder cache and the reserves the release charges."""

    usable: int
    weights: int
    batched_tokens: int
    lm_activation: int
    encoder_per_page: int
    encoder_pages: int
    encoder_cache: int
    sampler_per_seq: int
    kv_per_token: int
    reserves: int

    def encoder_activation(self, seqs: int) -> int:
        """The encoder pass of the profile run: ``min(encoder_pages, seqs)`` pages at once, at least one
        (vLLM profiles ``min(budget // item tokens, max_num_seqs x items per prompt)`` items)."""
        return self.encoder_per_page * max(1, min(self.encoder_pages, seqs)) if self.encoder_pages else 0

    def activation(self, seqs: int) -> int:
        """The profile run's peak above the weights with ``seqs`` as ``--max-num-seqs``: the largest
        of the decoder pass over ``max_num_batched_tokens``, the encoder pass and the sampler over
        ``min(max_num_batched_tokens, seqs)`` dummy sequences (they run one after another)."""
        sampler = min(seqs, self.batched_tokens) * self.sampler_per_seq
        return max(self.lm_activation, self.encoder_activation(seqs), sampler)

    def non_kv(self, seqs: int) -> int:
        """Bytes vLLM charges before the KV cache with ``seqs`` as ``--max-num-seqs``."""
        return self.weights + self.activation(seqs) + self.encoder_cache + self.reserves

    def kv_tokens(self, seqs: int) -> int:
        """KV-cache tokens with ``seqs`` as ``--max-num-seqs``, whole blocks (``num_blocks =
        available // (layers x page)``, ``vllm/v1/core/kv_cache_utils.py``)."""
        return max(0, (self.usable - self.non_kv(seqs)) // self.kv_per_token // BLOCK_SIZE * BLOCK_SIZE)

    def seqs(self, page_tokens: int) -> int:
        """Most pages of ``page_tokens`` that fit at once: the largest ``s`` with ``kv_tokens(s) >=
        s x page_tokens`` (binary search; the KV cache shrinks as the sampler's share grows)."""
        lo, hi = 0, max(0, self.usable // (page_tokens * self.kv_per_token))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.kv_tokens(mid) >= mid * page_tokens:
                lo = mid
            else:
                hi = mid - 1
        return lo


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _batched_tokens(budget: _Budget, engine: Engine) -> int:
    """``--max-num-batched-tokens``: the given one, else one page's prefill, at least :data:`MIN_BATCHED_TOKENS`."""
    if engine.max_num_batched_tokens:
        return engine.max_num_batched_tokens
    return max(MIN_BATCHED_TOKENS, _round_up(budget.visual + budget.prompt, BATCHED_TOKENS_ALIGN))


def encoder_items(batched: int, visual: int) -> int:
    """Pages vLLM's encoder budget holds: ``max(max_num_batched_tokens, one page's visual tokens)``
    tokens over one page's (``vllm/multimodal/profiling.py``, ``vllm/v1/core/encoder_cache_manager.py``
    ``compute_encoder_budget``; the profile run encodes at most ``max_num_seqs`` of them); 0 for
    text models."""
    return max(1, batched // visual) if visual else 0


def _memory(
    model: ModelSpec, gpu: GpuSpec, util: float, budget: _Budget, engine: Engine, tp: int = 1, pp: int = 1
) -> _Memory:
    act = ACTIVATION_BYTES
    batched = _batched_tokens(budget, engine)
    weights = model.weights_bytes // (tp * pp)
    lm = batched * (4 * model.hidden_size + 3 * model.intermediate_size) * act // tp
    patches = budget.visual * model.merge_size**2
    per_page = ENCODER_LIVE_LAYERS * patches * (4 * model.vision_hidden_size + 3 * model.vision_intermediate_size) * act
    cache = max(batched, budget.visual) * model.hidden_size * act if budget.visual else 0
    kv_heads = math.ceil(model.num_kv_heads / tp)
    layers = math.ceil(model.num_layers / pp)
    kv_bytes = KV_CACHE_DTYPE_BYTES[engine.kv_cache_dtype] or model.dtype_bytes
    return _Memory(
        usable=int(gpu.memory_bytes * util),
        weights=weights,
        batched_tokens=batched,
        lm_activation=lm,
        encoder_per_page=per_page,
        encoder_pages=encoder_items(batched, budget.visual),
        encoder_cache=cache,
        sampler_per_seq=model.vocab_size * engine.sampler_bytes_per_logit,
        kv_per_token=2 * layers * kv_heads * model.head_dim * kv_bytes,
        reserves=engine.reserves(tp * pp),
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


def _suggest(model: ModelSpec, gpu: GpuSpec, util: float, budget: _Budget, engine: Engine, need: int) -> str:
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
            if _memory(model, gpu, util, trial, engine).seqs(trial.page_tokens) >= need:
                best, lo = mid, mid + step
            else:
                hi = mid - step
        if best:
            ideas.append(f"max_pixels <= {best:,} (preprocess.max_pixels / --max-pixels)")
    lo, hi, best = 256, budget.max_tokens - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        trial = _Budget(budget.min_pixels, budget.max_pixels, mid, budget.visual, budget.prompt)
        if _memory(model, gpu, util, trial, engine).seqs(trial.page_tokens) >= need:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    if best:
        ideas.append(f"max_tokens <= {best} (--max-tokens)")
    bigger = [
        g.name
        for g in GPUS
        if g.memory_bytes > gpu.memory_bytes
        and _memory(model, g, util, budget, engine).seqs(budget.page_tokens) >= need
    ]
    if bigger:
        ideas.append("a bigger GPU: " + ", ".join(bigger[:4]))
    split = [
        n
        for n in (2, 4, 8)
        if model.num_attention_heads % n == 0
        and _memory(model, gpu, util, budget, engine, tp=n).seqs(budget.page_tokens) >= need
    ]
    if split:
        ideas.append(f"--gpus {split[0]} (tensor parallel over {split[0]} x {gpu.name})")
    return "; ".join(ideas) if ideas else "nothing in the registry fits this page budget"


def _weights_derivation(model: ModelSpec, shards: str) -> str:
    if model.weight_bytes:
        how = model.quantization or model.dtype
        return f"{model.weight_bytes:,} B ({how}){shards} [{model.sources.get('weight_bytes', '')}]"
    return (
        f"{model.parameters:,} parameters x {model.dtype_bytes} B ({model.dtype}){shards} "
        f"[{model.sources['parameters']}]"
    )


def _memory_steps(
    model: ModelSpec, gpu: GpuSpec, util: float, mem: _Memory, budget: _Budget, engine: Engine, seqs: int, shards: str
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
    kv_bytes = mem.kv_per_token // max(1, 2 * model.num_layers * model.num_kv_heads * model.head_dim)
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
        Step("weights_bytes", "weights", mem.weights, "bytes", _weights_derivation(model, shards)),
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
    model: ModelSpec, gpu: GpuSpec, util: float, budget: _Budget, engine: Engine, n: int
) -> tuple[str, list[Step]]:
    """Compare replicas, tensor and pipeline parallelism over ``n`` GPUs; return the choice and why."""
    page = budget.page_tokens
    single = _memory(model, gpu, util, budget, engine).seqs(page)
    tp_ok = model.num_attention_heads % n == 0 and (model.num_kv_heads % n == 0 or n % model.num_kv_heads == 0)
    tensor = _memory(model, gpu, util, budget, engine, tp=n).seqs(page) if tp_ok else 0
    pipe = _memory(model, gpu, util, budget, engine, pp=n).seqs(page) if model.num_layers >= n else 0
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

    Raises:
        PlanError: the model does not fit (the message says what would), a requested value is
            impossible, the settings contradict the model, or the release is not one the planner
            follows.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise PlanError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if gpus < 1:
        raise PlanError(f"--gpus must be >= 1, got {gpus}")
    warnings: list[str] = []
    _check_factor(model, factor, warnings)
    engine = _engine(vllm_version, overrides or {})
    _check_headroom(gpu, gpu_memory_utilization, engine)
    budget = _budget(model, min_pixels, max_pixels, max_tokens)
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
    mem = _memory(model, gpu, util, budget, engine, tp=tp, pp=pp)
    page = budget.page_tokens
    if page > model.max_position_embeddings:
        raise PlanError(
            f"one page needs {page} tokens but {model.id} supports {model.max_position_embeddings}; "
            f"lower max_tokens ({budget.max_tokens}) or max_pixels"
        )

    steps = [
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
    ]
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
        if mem.weights >= mem.usable:
            why = f"its weights alone take {gib(mem.weights)} of the {gib(mem.usable)} vLLM may use"
        else:
            left = max(0, mem.usable - mem.non_kv(1))
            why = (
                f"one page needs {gib(page * mem.kv_per_token)} of KV cache but only {gib(left)} is left after "
                f"{gib(mem.non_kv(1))} of weights, profile peak and reserves"
            )
        raise PlanError(
            f"{model.id} does not fit on {gpu.name} ({gpu.memory_gib:.1f} GiB x {util:g}): {why}. "
            f"What would fit: {_suggest(model, gpu, util, budget, engine, 1)}"
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
                f"{_suggest(model, gpu, util, budget, engine, max_num_seqs)}"
            )
        seqs, why = max_num_seqs, f"requested {max_num_seqs} (memory allows {fit})"
    kv_tokens = mem.kv_tokens(seqs)
    page_steps = 5  # the release and the page's tokens come first, then the memory that holds them
    steps[page_steps:page_steps] = _memory_steps(model, gpu, util, mem, budget, engine, seqs, shards)
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
    args = _vllm_args(model, gpu, util, budget, seqs, mem.batched_tokens, page, strategy, gpus)
    in_flight = math.ceil(seqs * (gpus if strategy == "replicas" else 1) * gateway_overcommit) + gateway_burst
    steps += _admission(args, engine, budget, in_flight)
    _apply_overrides(args, overrides or {}, model, mem, budget, kv_tokens, warnings)
    return Plan(model, gpu, gpus, strategy, args, model.vllm_flags, steps, warnings, engine.accounting.name)


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


def _engine(vllm_version: str | None, overrides: Mapping[str, object]) -> Engine:
    """The planned engine: the release's accounting and the overrides that enter the arithmetic."""
    try:
        accounting = accounting_for(vllm_version)
    except VersionError as exc:
        raise PlanError(str(exc)) from None
    batched = overrides.get("max_num_batched_tokens")
    kv_dtype = str(overrides.get("kv_cache_dtype") or "auto")
    if kv_dtype not in KV_CACHE_DTYPE_BYTES:
        raise PlanError(f"vllm.kv_cache_dtype={kv_dtype!r}: the planner sizes {', '.join(KV_CACHE_DTYPE_BYTES)}")
    return Engine(
        accounting,
        kv_cache_dtype=kv_dtype,
        enforce_eager=overrides.get("enforce_eager") is True,
        max_num_batched_tokens=None if batched in (None, "auto") else int(batched),
    )


def _check_headroom(gpu: GpuSpec, util: float, engine: Engine) -> None:
    """Refuse a utilization that leaves less than :meth:`Engine.headroom_needed` outside it: vLLM
    would not start (free memory after the CUDA context below ``total x utilization``)."""
    need = engine.headroom_needed()
    headroom = gpu.memory_bytes * (1 - util)
    if headroom < need:
        most = math.floor((1 - need / gpu.memory_bytes) * 100) / 100
        raise PlanError(
            f"gpu_memory_utilization {util:g} leaves {gib(headroom)} of {gpu.name}'s {gpu.memory_gib:.2f} GiB "
            f"outside vLLM's budget, below the {gib(need)} the CUDA context"
            + ("" if engine.graphs_charged or engine.enforce_eager else " and CUDA graphs")
            + f" need there (vLLM {engine.accounting.name} would refuse to start); at most {most:g}"
        )


def _admission(args: dict[str, object], engine: Engine, budget: _Budget, in_flight: int) -> list[Step]:
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


@dataclass(frozen=True)
class Startup:
    """What vLLM is predicted to compute when it starts with given flags, per GPU.

    Attributes:
        vllm_version: the release whose accounting was followed.
        weights: bytes of weights ("Model loading took").
        non_kv: bytes charged before the KV cache (weights, profile peak, encoder cache, reserves).
        kv_bytes: "Available KV cache memory", bytes (may be negative).
        kv_tokens: "GPU KV cache size", tokens (whole blocks; 0 when none fit).
        max_model_len, max_num_seqs, max_num_batched_tokens: the flags it starts with.
        error: why vLLM would refuse to start (its own wording where it has one), or ``None``.
    """

    vllm_version: str
    weights: int
    non_kv: int
    kv_bytes: int
    kv_tokens: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    error: str | None

    @property
    def max_concurrency(self) -> float:
        """ "Maximum concurrency for max_model_len tokens per request": KV tokens / max_model_len."""
        return self.kv_tokens / self.max_model_len


def predict_startup(
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    enforce_eager: bool = False,
    vllm_version: str | None = None,
    max_pixels: int | None = None,
    flashinfer_sampler: bool = False,
) -> Startup:
    """Predict vLLM's start-up arithmetic for ``vllm serve`` with these flags (the same terms the
    planner plans with): the KV cache it would size and whether it would start at all.

    The vision encoder is profiled at the largest page ``max_pixels`` allows (default: the
    model's), as vLLM does with ``--mm-processor-kwargs``; ``flashinfer_sampler`` says which
    top-k/top-p sampler vLLM profiles (its start-up log tells).

    Raises:
        PlanError: a release the planner does not follow, or an unknown ``kv_cache_dtype``.
    """
    overrides = {
        "max_num_batched_tokens": max_num_batched_tokens,
        "enforce_eager": enforce_eager,
        "kv_cache_dtype": kv_cache_dtype,
    }
    engine = replace(_engine(vllm_version, overrides), flashinfer_sampler=flashinfer_sampler)
    budget = _budget(model, None, max_pixels, None)
    mem = _memory(
        model, gpu, gpu_memory_utilization, budget, engine, tp=tensor_parallel_size, pp=pipeline_parallel_size
    )
    non_kv = mem.non_kv(max_num_seqs)
    kv_bytes = mem.usable - non_kv
    kv_tokens = mem.kv_tokens(max_num_seqs)
    return Startup(
        vllm_version=engine.accounting.name,
        weights=mem.weights,
        non_kv=non_kv,
        kv_bytes=kv_bytes,
        kv_tokens=kv_tokens,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=mem.batched_tokens,
        error=_startup_error(gpu, gpu_memory_utilization, engine, mem, kv_bytes, max_model_len),
    )


def _startup_error(
    gpu: GpuSpec, util: float, engine: Engine, mem: _Memory, kv_bytes: int, max_model_len: int
) -> str | None:
    """vLLM's reason to refuse these flags at start-up, or ``None``."""
    try:
        _check_headroom(gpu, util, engine)
    except PlanError as exc:
        return str(exc)
    if kv_bytes <= 0:
        return "No available memory for the cache blocks (vllm/v1/core/kv_cache_utils.py)"
    needed = -(-max_model_len // BLOCK_SIZE) * BLOCK_SIZE * mem.kv_per_token
    if needed > kv_bytes:
        return (
            f"To serve at least one request with the model's max seq len ({max_model_len}), {gib(needed)} KV cache "
            f"is needed, which is larger than the available KV cache memory ({gib(kv_bytes)})"
        )
    return None
