#!/usr/bin/env python
"""Measure a registry model's real GPU memory next to the planner's estimate of each quantity.

For any machine with an NVIDIA GPU (issue 11, part 5). The script builds the model at its real
size from a config made of the registry's shape data (``ocrserve/models/registry/*.yaml``) plus
the few architecture constants the registry does not hold (vision depth and heads, RoPE layout),
with random weights, directly on the GPU in the registry's dtype: nothing is downloaded. It then

1. runs the vision encoder on one page at the planner's pixel budget: the page shape whose visual
   tokens are the plan's ``visual_tokens`` (for HunyuanOCR that can be vLLM's 512 x 8192 profiling
   image), random pixels;
2. runs one decoder prefill over the plan's ``--max-num-batched-tokens`` (no KV cache kept: vLLM's
   profiling pass, which the activation estimate stands for);
3. allocates a KV cache for ``B`` sequences of ``--max-model-len`` tokens and runs decode steps of
   the whole batch through it, the sampler's fp32 logits and probabilities included. ``B`` is the
   planned ``--max-num-seqs`` unless that batch's KV cache does not fit in the memory free on this
   GPU (plain PyTorch holds each sequence's whole cache contiguously; vLLM pages it), or
   ``--max-seqs`` caps it; the table then says so and why;

and reads ``torch.cuda.max_memory_allocated`` around each step. The estimates are the planner's
own (:func:`ocrserve.gpu.planner.plan_serving`, the same ``Plan`` ``ocrserve plan`` prints), planned
for this GPU (or ``--gpu NAME``) with the profile's pixel budget. The table shows measured, estimate
and measured / estimate per quantity; the planner's estimates are meant to err high, so a ratio
above 1 is marked ``UNDER``. Each measurement that runs out of memory becomes a row saying so and
the others still run.

Architectures with a built-in config: ``hunyuan_vl`` (tencent/HunyuanOCR) and ``qwen2_5_vl``
(Qwen/Qwen2.5-VL-7B-Instruct, allenai/olmOCR-2-7B-1025). For any other model pass ``--model`` a
local folder holding its ``config.json`` (only the config is read; transformers must know the
architecture).

Needs ``torch`` with CUDA and ``transformers`` (``pip install -e '.[debug]'``). Without a GPU
(torch missing, or ``torch.cuda.is_available()`` false) it prints one line saying so and exits 2;
``--estimates-only`` prints the planner's side alone and needs neither. ``--device cpu`` runs the
whole code path on the CPU without measuring (slow at real size; for checking the script itself
with small caps).

Exit status: 0 done (1 with ``--strict`` when a measurement exceeds its estimate or ran out of
memory), 2 no GPU or bad arguments.

Examples::

    python scripts/gpu_check.py                          # HunyuanOCR, prod profile, this GPU
    python scripts/gpu_check.py --json gpu_check.json    # the same table, also as JSON
    python scripts/gpu_check.py --gpu "RTX 4090D"        # measure here the plan made for a 4090D
    python scripts/gpu_check.py --model Qwen/Qwen2.5-VL-7B-Instruct --max-seqs 4
    python scripts/gpu_check.py --max-pixels 1048576 --profile ''
    python scripts/gpu_check.py --estimates-only --gpu "RTX 4090D"    # no GPU needed
    python scripts/gpu_check.py --device cpu --dtype float32 --max-pixels 262144 --max-seqs 1 \\
        --context 512 --prefill-tokens 256 --max-tokens 256      # code path on a CPU, nothing measured
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ocrserve.gpu.memory import gib
from ocrserve.gpu.planner import Plan, PlanError, plan_serving
from ocrserve.gpu.registry import MIB, DetectedGpu, GpuError, GpuSpec, match_detected, resolve_gpu
from ocrserve.models import DEFAULT_MODEL, ModelError, ModelSpec, get_model

NO_GPU_EXIT = 2
HEADROOM_GIB = 2.0
"""Default memory kept free when sizing the KV cache to what this GPU has left (decode activations,
the sampler, allocator fragmentation)."""
UNDER_TOLERANCE = 1.02
"""A measurement above ``estimate x this`` is marked ``UNDER`` (buffers and alignment add a little)."""
HUGE_SIDE = 1 << 20
"""A side longer than any page: ``smart_resize`` of a square this big gives the square page at max_pixels."""

ARCH_CONSTANTS = {
    "hunyuan_vl": {
        "vision_layers": 27,
        "vision_heads": 16,
        "max_image_size": 2048,
        "rope": {"rope_type": "xdrope", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0},
        "source": "https://huggingface.co/tencent/HunyuanOCR/blob/main/config.json "
        "(vision_config.num_hidden_layers=27, num_attention_heads=16, max_image_size=2048; "
        "text rope_scaling xdrope alpha=1000, xdrope_section 4 x head_dim/8); "
        "a meta-device build gives the registry's 996,208,112 parameters",
    },
    "qwen2_5_vl": {
        "vision_layers": 32,
        "vision_heads": 16,
        "rope": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
        "source": "https://huggingface.co/Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json (vision depth=32, "
        "num_heads=16, window_size=112, fullatt_block_indexes=[7,15,23,31], temporal_patch_size=2; rope_theta=1e6, "
        "mrope_section=[16,24,24]); a meta-device build gives the registry's 8,292,166,656 parameters",
    },
}
"""Architecture constants the registry does not hold, per ``architecture``, with their source."""


class CheckError(RuntimeError):
    """The check cannot run as asked (unknown model, no config builder, plan impossible)."""


# ---------------------------------------------------------------------------------------------
# The planner's side
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimates:
    """The planner's numbers for the quantities this script measures (bytes, tokens, seqs).

    Every field is a :class:`ocrserve.gpu.planner.Plan` step value, except the per-sequence and
    batch KV products, which multiply the plan's ``kv_bytes_per_token`` by a context and a count.
    """

    plan: Plan
    parameters: int
    weights: int
    encoder_activation: int
    lm_activation: int
    encoder_cache: int
    kv_per_token: int
    sampler_per_seq: int
    cuda_context: int
    visual_tokens: int
    prompt_tokens: int
    page_tokens: int
    batched_tokens: int
    max_num_seqs: int
    min_pixels: int | None
    max_pixels: int | None

    def kv_per_seq(self, context: int) -> int:
        """KV-cache bytes of one sequence of ``context`` tokens."""
        return self.kv_per_token * context

    def total(self, seqs: int, context: int) -> int:
        """PyTorch-allocator peak the plan implies for ``seqs`` sequences of ``context`` tokens: weights,
        the larger activation peak, the encoder cache, their KV cache and sampler buffers (the
        CUDA-graph and CUDA-context reserves lie outside PyTorch's allocator)."""
        return (
            self.weights
            + max(self.lm_activation, self.encoder_activation)
            + self.encoder_cache
            + seqs * (self.kv_per_seq(context) + self.sampler_per_seq)
        )


def profile_budget(profile: str, spec: ModelSpec) -> dict:
    """``min_pixels``/``max_pixels``/``factor`` of a vLLM profile whose model is ``spec`` (else ``{}``),
    the way ``ocrserve plan`` takes them; ``''`` for none (the model's own bounds)."""
    if not profile:
        return {}
    from ocrserve.config import ConfigError, load_config

    try:
        config = load_config(profile, environ={})
    except ConfigError as exc:
        raise CheckError(f"{exc} (use --profile '' for the model's own pixel bounds)") from None
    if config.engine.kind != "vllm" or config.engine.model != spec.id:
        return {}
    return {
        "min_pixels": config.preprocess.min_pixels,
        "max_pixels": config.preprocess.max_pixels,
        "factor": config.preprocess.factor,
    }


def gather_estimates(
    spec: ModelSpec,
    gpu: GpuSpec,
    *,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    factor: int | None = None,
    max_tokens: int | None = None,
    gpu_memory_utilization: float = 0.90,
) -> Estimates:
    """Plan ``spec`` on one ``gpu`` with :func:`plan_serving` and collect the estimates to compare.

    Raises:
        CheckError: the planner cannot plan it (the model does not fit, bad pixel budget).
    """
    try:
        plan = plan_serving(
            spec,
            gpu,
            gpu_memory_utilization=gpu_memory_utilization,
            min_pixels=min_pixels if spec.supports_pixel_budget else None,
            max_pixels=max_pixels,
            factor=factor,
            max_tokens=max_tokens,
        )
    except PlanError as exc:
        raise CheckError(f"the planner cannot plan {spec.id} on {gpu.name}: {exc}") from None
    pixels = plan.vllm_args.get("mm_processor_kwargs") or {}
    value = plan.value
    return Estimates(
        plan=plan,
        parameters=spec.parameters,
        weights=int(value("weights_bytes")),
        encoder_activation=int(value("encoder_activation_bytes")),
        lm_activation=int(value("lm_activation_bytes")),
        encoder_cache=int(value("encoder_cache_bytes")),
        kv_per_token=int(value("kv_bytes_per_token")),
        sampler_per_seq=int(value("sampler_bytes_per_seq")),
        cuda_context=int(value("cuda_context_bytes")),
        visual_tokens=int(value("visual_tokens")),
        prompt_tokens=int(value("prompt_tokens")),
        page_tokens=int(value("page_tokens")),
        batched_tokens=int(value("max_num_batched_tokens")),
        max_num_seqs=int(value("max_num_seqs")),
        min_pixels=pixels.get("min_pixels"),
        max_pixels=pixels.get("max_pixels"),
    )


def worst_page(spec: ModelSpec, est: Estimates) -> tuple[int, int]:
    """``(height, width)`` px of the page that costs the plan's ``visual_tokens``: the larger of a
    square page at ``max_pixels`` and the model's profiling image, both through
    :func:`ocrserve.preprocess.geometry.smart_resize` (the shapes the planner's count comes from).

    Raises:
        CheckError: a tiling model (no pixel budget to run the encoder at).
    """
    from ocrserve.preprocess import geometry

    if not spec.supports_pixel_budget or est.max_pixels is None:
        raise CheckError(f"{spec.id} tiles pages itself; the encoder check needs a pixel-budget model")
    lo = est.min_pixels or spec.min_pixels or spec.factor**2
    candidates = [(HUGE_SIDE, HUGE_SIDE)] + ([tuple(spec.profile_image)] if spec.profile_image else [])
    sizes = [geometry.smart_resize(h, w, spec.factor, lo, est.max_pixels) for h, w in candidates]
    return max(sizes, key=lambda hw: (spec.visual_tokens(*hw), hw[0] * hw[1]))


def page_from_arg(spec: ModelSpec, est: Estimates, text: str) -> tuple[int, int]:
    """A ``HEIGHTxWIDTH`` page resized by the preprocessor's rule to the plan's pixel budget."""
    from ocrserve.preprocess import geometry

    try:
        h, w = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise CheckError(f"--page wants HEIGHTxWIDTH px (e.g. 1754x1240), got {text!r}") from None
    lo = est.min_pixels or spec.min_pixels or spec.factor**2
    return geometry.smart_resize(h, w, spec.factor, lo, est.max_pixels or h * w)


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the comparison: a quantity, its measurement and the planner's estimate.

    ``measured``/``estimate`` are bytes unless ``unit`` says otherwise; ``None`` when not measured
    (out of memory, CPU run, estimate-only) or not estimated. ``note`` says what was run.
    """

    key: str
    label: str
    measured: int | None
    estimate: int | None
    unit: str = "bytes"
    note: str = ""
    error: str = ""

    @property
    def ratio(self) -> float | None:
        if self.measured is None or not self.estimate:
            return None
        return self.measured / self.estimate

    @property
    def under(self) -> bool:
        """The measurement exceeds the estimate (beyond :data:`UNDER_TOLERANCE`)."""
        return self.ratio is not None and self.ratio > UNDER_TOLERANCE

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ratio"] = None if self.ratio is None else round(self.ratio, 4)
        out["under"] = self.under
        return out


def estimate_rows(est: Estimates, seqs: int | None = None, context: int | None = None) -> list[Row]:
    """The comparison rows with the planner's side filled in and nothing measured yet.

    Args:
        est: the planner's estimates.
        seqs: sequences in the decode batch (default: the planned ``--max-num-seqs``).
        context: tokens per sequence (default: the planned ``--max-model-len``, one page).
    """
    seqs = est.max_num_seqs if seqs is None else seqs
    context = est.page_tokens if context is None else context
    rows = [
        Row("parameters", "parameters", None, est.parameters, "count", "registry parameter count"),
        Row("weights", "weights", None, est.weights, note="parameters x dtype bytes"),
        Row(
            "vision_activation",
            "vision encoder, one page",
            None,
            est.encoder_activation,
            note=f"{est.visual_tokens:,} visual tokens at max_pixels {est.max_pixels or 0:,}",
        ),
        Row(
            "prefill_activation",
            "decoder prefill activations",
            None,
            est.lm_activation,
            note=f"{est.batched_tokens:,} tokens (--max-num-batched-tokens), no KV kept",
        ),
        Row(
            "kv_per_seq",
            "KV cache per sequence",
            None,
            est.kv_per_seq(context),
            note=f"{context:,} tokens x {est.kv_per_token:,} B",
        ),
        Row(
            "kv_batch",
            f"KV cache x {seqs} sequences",
            None,
            seqs * est.kv_per_seq(context),
            note=f"{seqs} x {context:,} tokens",
        ),
        Row(
            "decode_step",
            f"decode step, {seqs} sequences",
            None,
            seqs * est.sampler_per_seq,
            note="activations + fp32 logits/probs; estimate: sampler buffers x seqs",
        ),
        Row(
            "total",
            "peak allocated, whole run",
            None,
            est.total(seqs, context),
            note="weights + max(activations) + encoder cache + KV + sampler",
        ),
        Row(
            "outside_allocator",
            "outside PyTorch's allocator",
            None,
            est.cuda_context,
            note="device used - reserved (CUDA context, cuBLAS; device-wide)",
        ),
    ]
    if seqs != est.max_num_seqs or context != est.page_tokens:
        rows.insert(
            6,
            Row(
                "kv_planned",
                f"KV cache x {est.max_num_seqs} planned (not run)",
                None,
                est.max_num_seqs * est.kv_per_seq(est.page_tokens),
                note=f"{est.max_num_seqs} x {est.page_tokens:,} tokens",
            ),
        )
    return rows


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    if abs(n) >= 1024**3:
        return f"{n / 1024**3:.2f} GiB"
    return f"{n / MIB:.1f} MiB"


def render_table(rows: list[Row], title: str) -> Table:
    """The Rich table: quantity, measured, estimate, ratio, verdict and what was run."""
    table = Table(title=title, title_justify="left")
    for name in ("quantity", "measured", "estimate", "measured/est", "", "run"):
        table.add_column(name, justify="right" if name.startswith(("measured", "estimate")) else "left")
    for row in rows:
        fmt = (lambda n: "-" if n is None else f"{n:,}") if row.unit == "count" else _fmt_bytes
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}"
        verdict = "[red]UNDER[/red]" if row.under else ("[red]error[/red]" if row.error else "")
        note = f"[red]{row.error}[/red]" if row.error else row.note
        table.add_row(row.label, fmt(row.measured), fmt(row.estimate), ratio, verdict, note)
    return table


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def build_config(spec: ModelSpec, model_arg: str):
    """A transformers config at the model's real size: the registry's shape data plus
    :data:`ARCH_CONSTANTS`, or the ``config.json`` of a local folder given as ``--model``.

    Raises:
        CheckError: no built-in config for the architecture and no local folder.
    """
    folder = Path(model_arg).expanduser()
    if (folder / "config.json").is_file():
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    arch = spec.architecture
    try:
        return _builtin_config(spec, arch)
    except ImportError as exc:
        import transformers

        raise CheckError(
            f"transformers {transformers.__version__} cannot build {arch} ({exc}); HunYuanVL needs transformers >= 5.13"
        ) from None


def _builtin_config(spec: ModelSpec, arch: str):
    if arch not in ARCH_CONSTANTS:
        raise CheckError(
            f"no built-in config for {spec.id} (architecture {arch!r}; built in: {', '.join(ARCH_CONSTANTS)}); "
            "pass --model a local folder holding the model's config.json (only the config is read)"
        )
    c = ARCH_CONSTANTS[arch]
    text = {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
    }
    if arch == "hunyuan_vl":
        from transformers import HunYuanVLConfig

        rope = {**c["rope"], "xdrope_section": [spec.head_dim // 8] * 4}
        return HunYuanVLConfig(
            text_config={**text, "rope_parameters": rope},
            vision_config={
                "hidden_size": spec.vision_hidden_size,
                "intermediate_size": spec.vision_intermediate_size,
                "num_hidden_layers": c["vision_layers"],
                "num_attention_heads": c["vision_heads"],
                "patch_size": spec.patch_size,
                "spatial_merge_size": spec.merge_size,
                "max_image_size": c["max_image_size"],
                "out_hidden_size": spec.hidden_size,
            },
        )
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config={**text, "rope_parameters": dict(c["rope"])},
        vision_config={
            "depth": c["vision_layers"],
            "hidden_size": spec.vision_hidden_size,
            "intermediate_size": spec.vision_intermediate_size,
            "num_heads": c["vision_heads"],
            "out_hidden_size": spec.hidden_size,
            "patch_size": spec.patch_size,
            "spatial_merge_size": spec.merge_size,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
        },
        tie_word_embeddings=False,
    )


def build_model(config, torch, device, dtype, attn: str):
    """The model with random weights, built directly on ``device`` in ``dtype`` (no CPU copy)."""
    from transformers import AutoModelForImageTextToText

    with torch.device(device):
        try:
            model = AutoModelForImageTextToText.from_config(config, dtype=dtype, attn_implementation=attn)
        except TypeError:  # transformers < 5 spells it torch_dtype
            model = AutoModelForImageTextToText.from_config(config, torch_dtype=dtype, attn_implementation=attn)
    return model.eval()


def _language_model(model):
    inner = getattr(model, "model", None)
    lm = getattr(inner, "language_model", None) if inner is not None else None
    return lm if lm is not None else model.get_decoder()


def _cache_kwarg(lm) -> str:
    params = inspect.signature(lm.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


@dataclass
class Meter:
    """``max_memory_allocated`` around a step, relative to what was allocated before it."""

    torch: object
    device: object
    overall_peak: int = 0
    log: list[str] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def allocated(self) -> int | None:
        return self.torch.cuda.memory_allocated(self.device) if self.cuda else None

    def run(self, name: str, fn: Callable[[], object]) -> tuple[object, int | None, int | None, str]:
        """Run ``fn``; return ``(result, peak above the start, held after it, error)``.

        An out-of-memory error is caught and returned as the error text (the caches are emptied
        so the next step can run).
        """
        torch = self.torch
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        base = self.allocated()
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                result = fn()
            if self.cuda:
                torch.cuda.synchronize(self.device)
        except torch.cuda.OutOfMemoryError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "CUDA out of memory"
            self.log.append(f"{name}: {first}")
            gc.collect()
            if self.cuda:
                self.overall_peak = max(self.overall_peak, torch.cuda.max_memory_allocated(self.device))
                torch.cuda.empty_cache()
            return None, None, None, f"out of memory: {first[:160]}"
        except Exception as exc:  # a transformers API difference, a shape error: report it, run the rest
            self.log.append(f"{name}: {type(exc).__name__}: {exc}")
            if self.cuda:
                torch.cuda.empty_cache()
            return None, None, None, f"{type(exc).__name__}: {str(exc)[:160]}"
        self.log.append(f"{name}: {time.perf_counter() - started:.2f} s")
        if not self.cuda:
            return result, None, None, ""
        peak = torch.cuda.max_memory_allocated(self.device)
        self.overall_peak = max(self.overall_peak, peak)
        return result, peak - base, self.allocated() - base, ""


@dataclass
class Settings:
    """What to run (from the command line)."""

    page: tuple[int, int]
    prefill_tokens: int
    seqs: int
    context: int
    decode_steps: int
    cap_note: str


def gqa_copy_bytes(spec: ModelSpec, est: Estimates, seqs: int, context: int) -> int:
    """The transient copy plain PyTorch makes in a decode step: transformers' SDPA path expands one
    layer's K and V from the KV heads to all attention heads (``repeat_kv``) whenever a mask is
    given, which a static cache always needs; vLLM's paged attention reads the KV heads directly."""
    return seqs * est.kv_per_seq(context) * spec.num_attention_heads // (spec.num_layers * spec.num_kv_heads)


def decide_batch(spec: ModelSpec, est: Estimates, free: int | None, args) -> tuple[int, int, str]:
    """Sequences and context tokens for the decode check, and why they differ from the plan.

    The planned ``--max-num-seqs`` sequences of ``--max-model-len`` tokens, unless ``--max-seqs``
    or ``--context`` lower them, or their KV cache would not fit in ``free`` bytes minus
    ``--headroom-gib`` (plain PyTorch cannot page the cache the way vLLM does).
    """
    seqs, context = est.max_num_seqs, est.page_tokens
    notes = []
    if args.context is not None and args.context < context:
        context = args.context
        notes.append(f"context capped to {context:,} tokens by --context")
    if args.max_seqs is not None and args.max_seqs < seqs:
        seqs = args.max_seqs
        notes.append(f"batch capped to {seqs} by --max-seqs")
    if free is not None:
        room = free - int(args.headroom_gib * 1024**3)
        per_seq = est.kv_per_seq(context) + est.sampler_per_seq + gqa_copy_bytes(spec, est, 1, context)
        fits = max(0, room // per_seq)
        if fits < seqs:
            notes.append(
                f"batch capped from {seqs} to {fits}: plain PyTorch holds each sequence's whole KV cache "
                f"contiguously (no paging) and copies one layer's K/V per decode step (repeat_kv); "
                f"{seqs} x {gib(per_seq)} does not fit in the {gib(free)} free after the weights less "
                f"{args.headroom_gib:g} GiB headroom"
            )
            seqs = int(fits)
    return seqs, context, "; ".join(notes)


def measure(spec: ModelSpec, est: Estimates, args, torch, device) -> tuple[list[Row], dict]:
    """Build the model and run the three checks; the rows with both sides filled in, and run facts."""
    dtype = getattr(torch, args.dtype or spec.dtype)
    meter = Meter(torch, device)
    facts: dict = {"dtype": str(dtype).removeprefix("torch."), "attn_implementation": args.attn}
    config = build_config(spec, args.model)

    model, weights_peak, weights_held, error = meter.run(
        "build", lambda: build_model(config, torch, device, dtype, args.attn)
    )
    if model is None:
        raise CheckError(f"the model's weights alone do not fit: {error}")
    params = sum(p.numel() for p in model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    facts.update(model_class=type(model).__name__, parameter_bytes=param_bytes)
    free = torch.cuda.mem_get_info(device)[0] if meter.cuda else None

    page = page_from_arg(spec, est, args.page) if args.page else worst_page(spec, est)
    prefill_tokens = min(est.batched_tokens, args.prefill_tokens or est.batched_tokens)
    seqs, context, cap_note = decide_batch(spec, est, free, args)
    facts.update(page_hw=list(page), prefill_tokens=prefill_tokens, seqs=seqs, context=context, cap_note=cap_note)

    rows = estimate_rows(est, seqs, context)
    by_key = {row.key: row for row in rows}
    by_key["parameters"].measured = params
    by_key["weights"].measured = weights_held
    by_key["weights"].note += f" ({facts['model_class']}, {facts['dtype']})"

    # (a) vision encoder, one page
    vcfg = model.config.vision_config
    patch = vcfg.patch_size
    channels = getattr(vcfg, "num_channels", None) or getattr(vcfg, "in_channels", 3)
    per_patch = channels * getattr(vcfg, "temporal_patch_size", 1) * patch * patch
    grid = (1, page[0] // patch, page[1] // patch)
    patches = grid[0] * grid[1] * grid[2]

    def vision():
        pixels = torch.randn(patches, per_patch, dtype=dtype, device=device)
        thw = torch.tensor([grid], dtype=torch.long, device=device)
        out = model.get_image_features(pixel_values=pixels, image_grid_thw=thw)
        pooled = getattr(out, "pooler_output", out)
        return sum(t.shape[0] for t in pooled) if isinstance(pooled, (list, tuple)) else int(pooled.shape[-2])

    tokens, peak, _, error = meter.run("vision", vision)
    row = by_key["vision_activation"]
    row.measured, row.error = peak, error
    row.note = f"{page[0]}x{page[1]} px, {patches:,} patches" + (f" -> {tokens:,} tokens" if tokens else "")
    row.note += f"; plan: {est.visual_tokens:,} tokens"

    # (b1) decoder prefill, no cache kept
    lm = _language_model(model)
    head = model.get_output_embeddings()
    hidden = model.config.get_text_config().hidden_size

    def prefill():
        embeds = torch.randn(1, prefill_tokens, hidden, dtype=dtype, device=device)
        out = lm(inputs_embeds=embeds, use_cache=False)
        return head(out.last_hidden_state[:, -1:]).float().softmax(-1).argmax(-1)

    _, peak, _, error = meter.run("prefill", prefill)
    row = by_key["prefill_activation"]
    row.measured, row.error = peak, error
    row.note = f"{prefill_tokens:,} tokens, no KV kept; plan: {est.batched_tokens:,} (--max-num-batched-tokens)"

    # (b2) KV cache for the batch, then decode steps through it
    kv_rows = [by_key["kv_per_seq"], by_key["kv_batch"], by_key["decode_step"]]
    if seqs < 1:
        for row in kv_rows:
            row.error = cap_note or "no sequence fits"
    else:
        from transformers import StaticCache

        text_config = model.config.get_text_config()
        kw = _cache_kwarg(lm)
        holder: dict = {}

        def allocate():
            cache = StaticCache(config=text_config, max_cache_len=context)
            embeds = torch.randn(seqs, 1, hidden, dtype=dtype, device=device)
            lm(inputs_embeds=embeds, use_cache=True, **{kw: cache})  # first update allocates every layer
            holder["cache"] = cache
            return cache

        cache, _, kv_held, error = meter.run("kv", allocate)
        if cache is None:
            for row in kv_rows:
                row.error = error
        else:
            by_key["kv_batch"].measured = kv_held
            by_key["kv_per_seq"].measured = None if kv_held is None else kv_held // seqs

            def decode():
                token = None
                for _ in range(args.decode_steps):
                    embeds = torch.randn(seqs, 1, hidden, dtype=dtype, device=device)
                    out = lm(inputs_embeds=embeds, use_cache=True, **{kw: cache})
                    probs = head(out.last_hidden_state[:, -1]).float().softmax(-1)
                    token = probs.argmax(-1)
                return token

            _, peak, _, error = meter.run("decode", decode)
            row = by_key["decode_step"]
            row.measured, row.error = peak, error
            row.note = (
                f"{args.decode_steps} steps over a {context:,}-token cache; estimate: sampler x {seqs}; the "
                f"measurement includes plain PyTorch's repeat_kv copy of one layer "
                f"({gib(gqa_copy_bytes(spec, est, seqs, context))}), which vLLM does not make"
            )
        holder.clear()
        del cache
    if cap_note:
        by_key["kv_batch"].note += f" [{cap_note}]"

    by_key["total"].measured = meter.overall_peak if meter.cuda else None
    if meter.cuda:
        free_now, total = torch.cuda.mem_get_info(device)
        by_key["outside_allocator"].measured = (total - free_now) - torch.cuda.memory_reserved(device)
        facts["max_memory_reserved"] = torch.cuda.max_memory_reserved(device)
    facts["log"] = meter.log
    return rows, facts


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu_check.py",
        description=__doc__.split("\n\n", 1)[0]
        + " Builds the model at real size with random weights (no download), runs the vision encoder on "
        "one page at the planner's pixel budget, a prefill and a decode batch at the planned --max-num-seqs, "
        "and prints each measured peak (torch.cuda.max_memory_allocated) next to the planner's estimate.",
        epilog="Examples:\n  python scripts/gpu_check.py\n  python scripts/gpu_check.py --json out.json\n"
        '  python scripts/gpu_check.py --gpu "RTX 4090D" --max-seqs 4\n'
        '  python scripts/gpu_check.py --estimates-only --gpu "RTX 4090D"\n'
        "Exit status: 0 done, 1 with --strict when an estimate is under its measurement, 2 no GPU.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--model", default=DEFAULT_MODEL, help="registry id or a local folder with config.json (default %(default)s)")
    add("--profile", default="prod", help="profile giving the pixel budget, as ocrserve plan; '' for the model's own")
    add("--gpu", default=None, help="plan for this registry GPU instead of the one found (e.g. 'RTX 4090D')")
    add("--gpu-memory-utilization", type=float, default=0.90, help="as vLLM's flag (default %(default)s)")
    add("--min-pixels", type=int, default=None, help="pixel budget lower bound (overrides the profile)")
    add("--max-pixels", type=int, default=None, help="pixel budget per page (overrides the profile)")
    add("--max-tokens", type=int, default=None, help="output budget per page (default: the model recipe's)")
    add("--page", default=None, help="run the encoder on this HEIGHTxWIDTH page (resized to the budget) instead")
    add("--max-seqs", type=int, default=None, help="cap the decode batch (default: the planned --max-num-seqs)")
    add("--context", type=int, default=None, help="cap the tokens per sequence (default: --max-model-len)")
    add("--prefill-tokens", type=int, default=None, help="cap the prefill (default: --max-num-batched-tokens)")
    add("--decode-steps", type=int, default=2, help="decode steps of the whole batch (default %(default)s)")
    add("--headroom-gib", type=float, default=HEADROOM_GIB, help="kept free when sizing the KV (default %(default)s)")
    add("--dtype", choices=["bfloat16", "float16", "float32"], default=None, help="default: the registry's")
    add("--attn", default="sdpa", help="attn_implementation: sdpa, eager, flash_attention_2 (default %(default)s)")
    add("--device", default="cuda", help="cuda (default), cuda:N, or cpu (runs the code path, measures nothing)")
    add("--json", dest="json_path", default=None, help="also write the rows, plan and versions to this file")
    add("--estimates-only", action="store_true", help="print the planner's side only (no torch, no GPU needed)")
    add("--strict", action="store_true", help="exit 1 when a measurement exceeds its estimate or ran out of memory")
    args = parser.parse_args(argv)
    if args.estimates_only and not args.gpu:
        parser.error("--estimates-only needs --gpu NAME (nothing is detected)")
    for name in ("max_seqs", "context", "prefill_tokens", "decode_steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def no_gpu(message: str) -> int:
    print(f"gpu_check: no GPU: {message}", file=sys.stderr)
    return NO_GPU_EXIT


def _torch_and_device(args):
    """``(torch, device)`` or an exit status after a one-line message.

    PyTorch's allocator grows its segments in place (``expandable_segments``, unless
    ``PYTORCH_CUDA_ALLOC_CONF`` says otherwise): with fixed segments, the blocks the encoder and
    prefill steps left reserved were too fragmented for Qwen2.5-VL-7B's KV cache on an H200 (one
    12.01 GiB tensor refused with 10.62 GiB reserved and free), and its KV cache and decode rows
    went unmeasured."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    try:
        import torch
    except ImportError:
        return None, no_gpu("PyTorch is not installed (pip install -e '.[debug]' with a CUDA torch wheel)")
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("gpu_check: transformers is not installed (pip install -e '.[debug]')", file=sys.stderr)
        return None, NO_GPU_EXIT
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None, no_gpu(
                f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}); "
                "run it on a machine with an NVIDIA GPU"
            )
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return torch, device


def _gpu_here(torch, device) -> tuple[GpuSpec, dict]:
    props = torch.cuda.get_device_properties(device)
    mib = props.total_memory // MIB
    spec = DetectedGpu(props.name, mib, 1, match_detected(props.name, mib), "torch").as_spec()
    return spec, {
        "name": props.name,
        "memory_gib": round(props.total_memory / 1024**3, 2),
        "compute_capability": f"{props.major}.{props.minor}",
        "registry_entry": spec.name,
    }


def _versions(torch=None) -> dict:
    import ocrserve

    out = {"python": platform.python_version(), "ocrserve": getattr(ocrserve, "__version__", "?")}
    if torch is not None:
        import transformers

        out.update(torch=torch.__version__, cuda=torch.version.cuda, transformers=transformers.__version__)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if not console.is_terminal:  # logs and pipes: wide enough for the notes
        console = Console(width=160)
    torch = device = None
    gpu_facts: dict = {}
    if not args.estimates_only:
        torch, device = _torch_and_device(args)
        if torch is None:
            return device
    try:
        spec = get_model(args.model)
        if args.gpu:
            gpu, _ = resolve_gpu(args.gpu, None)
        elif device.type == "cuda":
            gpu, gpu_facts = _gpu_here(torch, device)
        else:
            raise CheckError("--device cpu needs --gpu NAME to plan for")
        budget = profile_budget(args.profile, spec)
        for key in ("min_pixels", "max_pixels"):
            if getattr(args, key) is not None:
                budget[key] = getattr(args, key)
        est = gather_estimates(
            spec, gpu, max_tokens=args.max_tokens, gpu_memory_utilization=args.gpu_memory_utilization, **budget
        )
        if device is not None and device.type == "cuda" and not gpu_facts:
            _, gpu_facts = _gpu_here(torch, device)
        if args.estimates_only:
            rows, facts = estimate_rows(est), {}
        else:
            rows, facts = measure(spec, est, args, torch, device)
    except (CheckError, ModelError, GpuError) as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    where = gpu_facts.get("name") or str(device or "no device")
    title = (
        f"{spec.id} - plan for {gpu.name} ({gpu.memory_gib:.1f} GiB): --max-num-seqs {est.max_num_seqs}, "
        f"--max-model-len {est.page_tokens:,}; measured on {where}"
    )
    console.print(render_table(rows, title))
    versions = _versions(torch)
    console.print(
        ", ".join(f"{k} {v}" for k, v in {**gpu_facts, **versions}.items()),
        highlight=False,
        style="dim",
    )
    if facts.get("log"):
        console.print("steps: " + "; ".join(facts["log"]), highlight=False, style="dim")
    if facts.get("cap_note"):
        console.print(f"note: {facts['cap_note']}", highlight=False)
    if args.json_path:
        doc = {
            "model": spec.id,
            "planned_for": gpu.name,
            "gpu": gpu_facts,
            "versions": versions,
            "run": facts,
            "rows": [row.to_dict() for row in rows],
            "plan": est.plan.to_dict(),
        }
        Path(args.json_path).write_text(json.dumps(doc, indent=2) + "\n")
    bad = any(row.under or row.error for row in rows)
    return 1 if args.strict and bad else 0


if __name__ == "__main__":
    sys.exit(main())
