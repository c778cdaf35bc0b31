"""``ocrserve launch``: start the gateway (and, for the vLLM engine, the ``vllm serve`` it plans)."""

from __future__ import annotations

import shlex
from typing import Annotated

import typer
from rich.console import Console

from ocrserve.cli.common import Overrides, err_console, load_or_exit
from ocrserve.cli.plan_render import render_table
from ocrserve.config import Config
from ocrserve.engines import create_engine
from ocrserve.gpu.launcher import (
    AddressTaken,
    VllmStartError,
    gateway_command,
    gateway_config,
    manages_vllm,
    plan_for,
    run_gateway,
    run_with_vllm,
    vllm_command,
)
from ocrserve.gpu.planner import PlanError
from ocrserve.gpu.registry import GpuError
from ocrserve.models import ModelError


def launch(
    profile: Annotated[
        str, typer.Option(help="Shipped profile (local, prod, gpu-24g, ...; see `ocrserve profiles`) or a YAML path.")
    ] = "local",
    host: Annotated[str | None, typer.Option(help="Bind address (server.host).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (server.port).")] = None,
    set_: Overrides = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and command lines, then exit 0.")] = False,
) -> None:
    """Start the OCR gateway for a profile; for prod, plan and start vLLM first.

    With the vLLM engine (prod, gpu-24g, gpu-12g) the launcher plans `vllm serve` for the GPU,
    prints the plan and both command lines, starts vLLM, waits for its /health, then starts the
    gateway; it restarts vLLM if it dies, and Ctrl-C drains requests and stops both. With
    engine.vllm.base_urls set it starts only the gateway, in front of those servers.

    Examples:

        ocrserve launch                              # CPU OCR on http://127.0.0.1:8000

        ocrserve launch --host 0.0.0.0 --port 9000 --set engine.onnx.det_workers=2

        OCRSERVE_SERVER__MAX_UPLOAD_MB=100 ocrserve launch --profile local

        ocrserve launch --profile prod               # vLLM + gateway on this machine's GPU

        ocrserve launch --profile prod --dry-run --set vllm.gpu="RTX 4090D"   # plan and commands only

        ocrserve launch --profile prod --set engine.vllm.base_urls=\\[http://gpu1:8001] --set vllm.max_num_seqs=9
    """
    overrides = list(set_ or [])
    if host is not None:
        overrides.append(f"server.host={host}")
    if port is not None:
        overrides.append(f"server.port={port}")
    config = load_or_exit(profile, overrides)
    Console().print(
        f"[bold]ocrserve[/bold] profile [cyan]{config.profile}[/cyan]: engine {config.engine.kind} "
        f"({config.engine.model}) on http://{config.server.host}:{config.server.port}",
        soft_wrap=True,
    )
    if manages_vllm(config):
        _launch_with_vllm(config, dry_run)
        return
    try:
        create_engine(config)  # loads nothing: a bad engine section fails here, not in the server
    except ValueError as exc:
        raise _fail(exc, 2) from None
    typer.echo("gateway: " + shlex.join(gateway_command(config)))
    if not dry_run:
        try:
            run_gateway(config)
        except AddressTaken as exc:
            raise _fail(exc) from None


def _launch_with_vllm(config: Config, dry_run: bool) -> None:
    try:
        plan = plan_for(config)
    except (ModelError, GpuError, PlanError) as exc:
        hint = " For ocrserve launch: --set vllm.gpu=NAME or --set vllm.gpu_memory_gib=GIB." * isinstance(exc, GpuError)
        raise _fail(f"{exc}{hint}", 2) from None
    Console().print(render_table(plan))
    typer.echo("vLLM:    " + shlex.join(vllm_command(config, plan)))
    typer.echo("gateway: " + shlex.join(gateway_command(gateway_config(config, plan))))
    if dry_run:
        return
    try:
        raise typer.Exit(run_with_vllm(config, plan))
    except (VllmStartError, AddressTaken) as exc:
        raise _fail(exc) from None


def _fail(exc: Exception | str, code: int = 1) -> typer.Exit:
    err_console.print(f"error: {exc}", highlight=False, markup=False, style="bold red")
    return typer.Exit(code)
