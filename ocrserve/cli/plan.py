"""``ocrserve plan`` and ``ocrserve models``: vLLM flags from GPU memory, and the model registry."""

from __future__ import annotations

import dataclasses
import json
from enum import Enum
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Column, Table

from ocrserve.cli.common import Overrides, err_console
from ocrserve.cli.plan_render import RENDERERS, render_defaults
from ocrserve.config import ConfigError, load_config
from ocrserve.gpu.cpu_planner import plan_cpu_serving
from ocrserve.gpu.defaults import compare_defaults
from ocrserve.gpu.host import HostError, detect_host
from ocrserve.gpu.lengths import LengthsError, prior
from ocrserve.gpu.lengths import load as load_lengths
from ocrserve.gpu.planner import Plan, PlanError, plan_serving
from ocrserve.gpu.registry import GpuError, resolve_gpu
from ocrserve.models import DEFAULT_MODEL, ModelError, get_model, list_models


class Format(str, Enum):
    """Output formats of ``ocrserve plan``."""

    table = "table"
    yaml = "yaml"
    json = "json"
    argv = "argv"


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[bold red]error:[/bold red] {message}", highlight=False)
    return typer.Exit(2)


def profile_settings(profile: str, model: str | None, overrides: list[str]) -> dict:
    """Model, pixel budget and ``vllm`` section of a profile with ``--set`` ``overrides`` applied;
    empty for ``--profile ''``.

    Only profiles of the ``vllm`` engine are used (the CPU profiles' models and pixel budgets belong
    to other engines). A profile's pixel budget and factor belong to its model, so they are left
    out when ``model`` names another. The ``vllm`` section's keys are vLLM engine arguments.

    Raises:
        typer.Exit: the profile does not exist or is invalid, or ``--set`` without a profile (2).
    """
    if not profile:
        if overrides:
            raise _fail("--set changes a profile's keys; name the profile (--profile prod)")
        return {}
    try:
        config = load_config(profile, overrides, environ={})
    except ConfigError as exc:
        raise _fail(f"{exc} (plan without a profile: --profile '')") from None
    if config.engine.kind != "vllm":
        err_console.print(
            f"note: profile {profile!r} runs the {config.engine.kind} engine; planning from the flags alone",
            style="dim",
            highlight=False,
        )
        return {}
    settings: dict = {
        "model": config.engine.model,
        "vllm": config.vllm.model_dump(),
        "vllm_version": _number(config.vllm.version),
        "overcommit": config.router.slot_overcommit,
        "burst": config.router.fast.burst_slots,
        "device": config.vllm.device,
        "overflow": config.vllm.kv_overflow_target,
        "output_lengths": config.vllm.output_lengths,
        "speculative": config.vllm.speculative,
        "task": config.engine.vllm.task,
        "cpu": {
            "memory_gib": config.vllm.cpu_memory_gib,
            "kv_cache_fraction": config.vllm.cpu_kv_cache_fraction,
            "kv_cache_max_gib": config.vllm.cpu_kv_cache_max_gib,
            "threads_bind": config.vllm.cpu_threads_bind,
        },
    }
    if model is None or model == config.engine.model:
        settings.update(
            min_pixels=config.preprocess.min_pixels,
            max_pixels=config.preprocess.max_pixels,
            factor=config.preprocess.factor,
        )
    return settings


def plan(
    profile: Annotated[
        str, typer.Option(help="Profile supplying model, pixel budget and vllm settings (flags win); '' for none.")
    ] = "prod",
    model: Annotated[str | None, typer.Option(help="Registry id or a local folder with config.json.")] = None,
    gpu: Annotated[str, typer.Option(help="GPU name (e.g. 'RTX 4090D', a100-80g) or 'auto' to detect.")] = "auto",
    gpu_memory: Annotated[
        float | None, typer.Option(min=1, help="Memory per GPU, GiB (overrides the registry).")
    ] = None,
    gpus: Annotated[
        int | None, typer.Option(min=1, help="Number of GPUs (default: 1, or all detected with auto).")
    ] = None,
    p95: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="p95 page-latency target, s: caps --max-num-seqs (decode speed estimated from the GPU's "
            "memory bandwidth).",
        ),
    ] = None,
    max_pixels: Annotated[
        int | None, typer.Option(min=1, help="Pixel budget per page (overrides the profile).")
    ] = None,
    max_tokens: Annotated[int | None, typer.Option(min=1, help="Output-token budget per page.")] = None,
    gpu_memory_utilization: Annotated[
        float | None, typer.Option(min=0.01, max=1.0, help="Fraction of GPU memory vLLM may use (default 0.90).")
    ] = None,
    fmt: Annotated[
        Format, typer.Option("--format", help="table, yaml, json or argv (the vllm serve command).")
    ] = Format.table,
    vllm_version: Annotated[
        str | None,
        typer.Option(
            help="vLLM release to plan for (its start-up accounting); default: the installed one, else the "
            "newest the planner knows."
        ),
    ] = None,
    compare_defaults_: Annotated[
        bool,
        typer.Option(
            "--compare-defaults",
            help="Show, flag by flag, what vLLM's own defaults would do to this model and page budget next to the "
            "plan (start-up failure, chunked prefill, preemption); --format json for the same as JSON.",
        ),
    ] = False,
    output_lengths: Annotated[
        str | None,
        typer.Option(
            help="Output tokens per page: a bench report (report.json or its folder) or a corpus folder (index.json); "
            "default: the registry's prior (or vllm.output_lengths).",
        ),
    ] = None,
    overflow: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=0.999,
            help="Plan --max-num-seqs statistically: the most pages whose KV cache outgrows vLLM's with at most this "
            "chance (e.g. 0.01; vllm.kv_overflow_target). Default: the worst case, shown beside it.",
        ),
    ] = None,
    speculative: Annotated[
        bool,
        typer.Option(
            "--speculative", help="Emit --speculative-config from the model's registry entry (vllm.speculative)."
        ),
    ] = False,
    set_: Overrides = None,
) -> None:
    """Plan `vllm serve` flags for an OCR model on a GPU, showing how each number is derived.

    The KV cache left after weights, activations and reserves is divided by the tokens one page can
    need (visual tokens at max_pixels + prompt + max output), which sets --max-num-seqs; the other
    flags follow from the page and the model card.

    With vllm.device=cpu (the cpu-vllm profile) the plan is for vLLM's CPU backend on this host:
    the KV cache (--kv-cache-memory-bytes) from the memory available now, the threads
    (VLLM_CPU_OMP_THREADS_BIND) from its cores; the GPU options do not apply.

    Examples:

        ocrserve plan --gpu "RTX 4090D"

        ocrserve plan --model allenai/olmOCR-2-7B-1025 --gpu a100-80g --format yaml

        ocrserve plan --model PaddlePaddle/PaddleOCR-VL --gpu rtx3060 --p95 20

        ocrserve plan --gpu-memory 24 --gpus 2 --format argv

        ocrserve plan --model ./checkpoints/my-qwen2.5-vl --gpu auto

        ocrserve plan --gpu "H100 80G" --set vllm.max_model_len=32768 --set preprocess.max_pixels=2000000

        ocrserve plan --gpu l40s --vllm-version 0.18.1 --set vllm.kv_cache_dtype=fp8

        ocrserve plan --gpu "RTX 4090" --compare-defaults     # why not vllm serve's own defaults?

        ocrserve plan --gpu "H100 80GB" --overflow 0.01 --output-lengths bench-out/report.json

        ocrserve plan --model tencent/HunyuanOCR-1.5 --gpu "H100 80GB" --speculative

        ocrserve plan --profile cpu-vllm --set engine.model=./my-model     # vLLM's CPU backend on this host
    """
    settings = profile_settings(profile, model, list(set_ or []))
    if settings.get("device") == "cpu":
        gpu_options = {
            "--gpu": gpu != "auto",
            "--gpu-memory": gpu_memory is not None,
            "--gpus": gpus is not None,
            "--p95": p95 is not None,
            "--gpu-memory-utilization": gpu_memory_utilization is not None,
            "--compare-defaults": compare_defaults_,
        }
        given = [name for name, on in gpu_options.items() if on]
        if given:
            raise _fail(f"{', '.join(given)}: a GPU option, and this plan is for vLLM's CPU backend (vllm.device=cpu)")
        _plan_cpu(
            spec_id=model or settings.get("model") or DEFAULT_MODEL,
            settings=settings,
            max_pixels=max_pixels,
            max_tokens=max_tokens,
            vllm_version=vllm_version,
            fmt=fmt,
        )
        return
    try:
        result = gpu_plan(
            settings,
            model=model,
            gpu=gpu,
            gpu_memory=gpu_memory,
            gpus=gpus,
            gpu_memory_utilization=gpu_memory_utilization,
            max_pixels=max_pixels,
            max_tokens=max_tokens,
            p95=p95,
            vllm_version=vllm_version,
            output_lengths=output_lengths,
            overflow=overflow,
            speculative=speculative,
            predict=fmt is not Format.argv and not compare_defaults_,
        )
    except (ModelError, GpuError, PlanError, LengthsError) as exc:
        raise _fail(str(exc)) from None
    if compare_defaults_:
        _print_defaults(result, fmt)
        return
    rendered = RENDERERS[fmt.value](result)
    if fmt is Format.table:
        Console().print(rendered)
    else:
        typer.echo(rendered)


def gpu_plan(
    settings: dict,
    *,
    model: str | None,
    gpu: str,
    gpu_memory: float | None = None,
    gpus: int | None = None,
    gpu_memory_utilization: float | None = None,
    max_pixels: int | None = None,
    max_tokens: int | None = None,
    p95: float | None = None,
    vllm_version: str | None = None,
    output_lengths: str | None = None,
    overflow: float | None = None,
    speculative: bool = False,
    predict: bool = True,
) -> Plan:
    """The GPU plan of ``ocrserve plan`` (and ``ocrserve capacity --gpu``): the profile's
    ``settings`` (:func:`profile_settings`) under the options given; with ``predict``, the three
    ``--max-num-seqs`` compared with the scheduler model's predictions.

    Raises:
        ModelError, GpuError, PlanError, LengthsError: what ``plan_serving`` and its inputs raise.
    """
    vllm_settings = dict(settings.get("vllm") or {})
    spec = get_model(model or settings.get("model") or DEFAULT_MODEL)
    lengths_from = output_lengths or settings.get("output_lengths") or None
    lengths = load_lengths(lengths_from) if lengths_from else None
    gpu_spec, detected = resolve_gpu(gpu, gpu_memory)
    return plan_serving(
        spec,
        gpu_spec,
        gpus=gpus or detected,
        gpu_memory_utilization=gpu_memory_utilization or _number(vllm_settings.get("gpu_memory_utilization")) or 0.90,
        p95_seconds=p95,
        **_shared_arguments(spec, settings, vllm_settings, max_pixels, max_tokens, vllm_version),
        output_lengths=lengths or (_prior(spec, settings.get("task", "text")) if predict else None),
        overflow_target=overflow if overflow is not None else settings.get("overflow"),
        speculative=speculative or bool(settings.get("speculative")),
        predict=predict,
    )


def _shared_arguments(
    spec, settings: dict, vllm_settings: dict, max_pixels: int | None, max_tokens: int | None, vllm_version: str | None
) -> dict:
    """The arguments the GPU and the CPU plan take alike, from the profile's ``settings`` under the
    options given: the page's pixel budget and tokens, ``--max-num-seqs``, the vLLM overrides and
    version, the gateway's overcommit and burst slots."""
    return {
        "min_pixels": settings.get("min_pixels") if spec.supports_pixel_budget else None,
        "max_pixels": max_pixels or settings.get("max_pixels"),
        "factor": settings.get("factor"),
        "max_tokens": max_tokens,
        "max_num_seqs": _number(vllm_settings.get("max_num_seqs")),
        "overrides": vllm_settings,
        "vllm_version": vllm_version or settings.get("vllm_version"),
        "gateway_overcommit": settings.get("overcommit", 1.0),
        "gateway_burst": settings.get("burst", 0),
    }


def _prior(spec, task: str):
    """The registry's output-length prior of ``spec`` for ``task``."""
    return prior(spec.id, task, spec.output_tokens, spec.sources.get("output_tokens", ""))


def _plan_cpu(
    spec_id: str, settings: dict, max_pixels: int | None, max_tokens: int | None, vllm_version: str | None, fmt: Format
) -> None:
    """The CPU path of ``ocrserve plan``: this host in place of the GPU (``vllm.device=cpu``)."""
    vllm_settings = dict(settings.get("vllm") or {})
    cpu = settings["cpu"]
    try:
        spec = get_model(spec_id)
        result = plan_cpu_serving(
            spec,
            detect_host(cpu["memory_gib"]),
            kv_cache_fraction=cpu["kv_cache_fraction"],
            kv_cache_max_gib=cpu["kv_cache_max_gib"],
            threads_bind=cpu["threads_bind"],
            **_shared_arguments(spec, settings, vllm_settings, max_pixels, max_tokens, vllm_version),
        )
    except (ModelError, HostError, PlanError) as exc:
        raise _fail(str(exc)) from None
    rendered = RENDERERS[fmt.value](result)
    if fmt is Format.table:
        Console().print(rendered)
    else:
        typer.echo(rendered)


def _print_defaults(plan: Plan, fmt: Format) -> None:
    rows = compare_defaults(plan)
    if fmt is Format.table:
        Console().print(render_defaults(plan, rows))
    elif fmt is Format.json:
        data = {
            "vllm_version": plan.vllm_version,
            "model": plan.model.id,
            "gpu": plan.gpu.name,
            "defaults": [dataclasses.asdict(row) for row in rows],
        }
        typer.echo(json.dumps(data, indent=2))
    else:
        raise _fail("--compare-defaults prints a table or --format json")


def _number(value):
    """A configured number, or ``None`` for absent/``auto``."""
    return None if value in (None, "auto") else value


def models() -> None:
    """List the OCR models the planner knows, with the numbers that size their KV cache.

    Examples:

        ocrserve models
    """
    table = Table(
        Column("model", overflow="fold"),
        "params",
        "layers x kv heads x head dim",
        "KV/token",
        "factor",
        "pixels",
        "max tokens",
        "vLLM >=",
    )
    for spec in list_models():
        pixels = f"{spec.min_pixels:,}..{spec.max_pixels:,}" if spec.supports_pixel_budget else "tiled (1024 + 6x640)"
        table.add_row(
            spec.id,
            f"{spec.parameters / 1e9:.2f}B",
            f"{spec.num_layers} x {spec.num_kv_heads} x {spec.head_dim}",
            f"{spec.kv_bytes_per_token() // 1024} KiB",
            str(spec.factor),
            pixels,
            str(spec.max_tokens),
            spec.min_vllm,
        )
    Console().print(table)
