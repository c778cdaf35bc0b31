"""vLLM's start-up memory arithmetic, per GPU, ahead of time: what ``determine_available_memory``
(``vllm/v1/worker/gpu_worker.py``) will leave for the KV cache with given flags.

``usable = total x gpu_memory_utilization`` (the total as CUDA reports it), minus the weights, the
profile run's peak (the largest of the decoder pass over ``max_num_batched_tokens``, the vision
encoder over the pages its budget holds, and the sampler over ``max_num_seqs`` dummy rows), the
encoder cache, and the memory outside PyTorch, NCCL and CUDA graphs where the target release
charges them (:mod:`ocrserve.gpu.vllm_versions`). The rest is KV cache, in whole 16-token blocks.
The planner (:mod:`ocrserve.gpu.planner`) chooses flags with these terms; :func:`predict_startup`
applies them to flags given, as in a start-up log.

Units: bytes for memory, tokens for sequence quantities. Estimates are labelled as such, each with
what it was fitted on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ocrserve.gpu.registry import GIB, GpuSpec
from ocrserve.gpu.vllm_versions import Accounting, VersionError, accounting_for
from ocrserve.models import ModelSpec

DEFAULT_GPU_MEMORY_UTILIZATION = 0.90
"""vLLM's own default (``vllm/config/cache.py`` ``gpu_memory_utilization = 0.9``); lower it when the
GPU is shared with another process."""
BLOCK_SIZE = 16
"""KV-cache block, tokens (``vllm/config/cache.py`` ``CacheConfig.DEFAULT_BLOCK_SIZE = 16``)."""
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


class PlanError(ValueError):
    """The model does not fit, or a requested setting cannot be met; the message says what would."""


def gib(n: float) -> str:
    """``n`` bytes as GiB with two decimals."""
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class Budget:
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
class VllmEngineArgs:
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
class Memory:
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


def _batched_tokens(budget: Budget, engine: VllmEngineArgs) -> int:
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


def memory_for(
    model: ModelSpec, gpu: GpuSpec, util: float, budget: Budget, engine: VllmEngineArgs, tp: int = 1, pp: int = 1
) -> Memory:
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
    return Memory(
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


def page_budget(model: ModelSpec, min_pixels: int | None, max_pixels: int | None, max_tokens: int | None) -> Budget:
    """One page's token budget: pixel bounds (default: the model's), output tokens, visual tokens at
    the bounds and the prompt.

    Raises:
        PlanError: ``max_pixels`` below ``min_pixels`` or below one visual token (``factor^2``),
            or ``max_tokens`` below 1.
    """
    lo = min_pixels if min_pixels is not None else model.min_pixels
    hi = max_pixels if max_pixels is not None else model.max_pixels
    if not model.supports_pixel_budget:
        lo = hi = None
    out = max_tokens if max_tokens is not None else model.max_tokens
    if lo is not None and hi is not None and hi < lo:
        raise PlanError(f"max_pixels {hi:,} is below min_pixels {lo:,}: a page could not satisfy both")
    if out < 1:
        raise PlanError(f"max_tokens must be >= 1, got {out}")
    if hi is not None and hi < model.factor**2:
        raise PlanError(f"max_pixels {hi:,} is below one visual token ({model.factor} x {model.factor} px)")
    return Budget(lo, hi, out, model.max_visual_tokens(lo, hi), model.prompt_tokens())


def engine_for(vllm_version: str | None, overrides: Mapping[str, object]) -> VllmEngineArgs:
    """The planned engine: the release's accounting and the overrides that enter the arithmetic."""
    try:
        accounting = accounting_for(vllm_version)
    except VersionError as exc:
        raise PlanError(str(exc)) from None
    batched = overrides.get("max_num_batched_tokens")
    kv_dtype = str(overrides.get("kv_cache_dtype") or "auto")
    if kv_dtype not in KV_CACHE_DTYPE_BYTES:
        raise PlanError(f"vllm.kv_cache_dtype={kv_dtype!r}: the planner sizes {', '.join(KV_CACHE_DTYPE_BYTES)}")
    return VllmEngineArgs(
        accounting,
        kv_cache_dtype=kv_dtype,
        enforce_eager=overrides.get("enforce_eager") is True,
        max_num_batched_tokens=None if batched in (None, "auto") else int(batched),
    )


def check_headroom(gpu: GpuSpec, util: float, engine: VllmEngineArgs) -> None:
    """Refuse a utilization that leaves less than :meth:`VllmEngineArgs.headroom_needed` outside it: vLLM
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
    engine = replace(engine_for(vllm_version, overrides), flashinfer_sampler=flashinfer_sampler)
    budget = page_budget(model, None, max_pixels, None)
    mem = memory_for(
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
    gpu: GpuSpec, util: float, engine: VllmEngineArgs, mem: Memory, kv_bytes: int, max_model_len: int
) -> str | None:
    """vLLM's reason to refuse these flags at start-up, or ``None``."""
    try:
        check_headroom(gpu, util, engine)
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
