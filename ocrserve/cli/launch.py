"""``ocrserve launch``: start the gateway (and, for the vLLM engine, the ``vllm serve`` it plans)."""

from __future__ import annotations

import shlex
import shutil
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from ocrserve.cli.common import Overrides, SetFiles, err_console, load_or_exit, overlay_overrides
from ocrserve.cli.plan_render import render_table
from ocrserve.config import Config, dedupe_overrides, profile_path
from ocrserve.engines import create_engine
from ocrserve.extras import MissingExtra
from ocrserve.gateway import AddressTaken, gateway_command, run_gateway
from ocrserve.gpu.host import HostError
from ocrserve.gpu.launcher import (
    VllmStartError,
    gateway_config,
    manages_vllm,
    plan_for,
    run_with_vllm,
    vllm_command,
)
from ocrserve.gpu.lengths import LengthsError
from ocrserve.gpu.planner import Plan, PlanError
from ocrserve.gpu.registry import GpuError, NoGpuFound
from ocrserve.models import ModelError
from ocrserve.store import check_store

#: The GPU a dry run plans for on a machine without one (unless ``vllm.gpu`` names another).
DRY_RUN_GPU = "H100 80G"


def launch(
    profile: Annotated[
        str,
        typer.Option(
            metavar="NAME|PATH",
            help="Shipped profile (local, prod, gpu-24g, ...; see `ocrserve profiles`) or a YAML path.",
        ),
    ] = "local",
    host: Annotated[str | None, typer.Option(metavar="ADDRESS", help="Bind address (server.host).")] = None,
    port: Annotated[int | None, typer.Option(metavar="PORT", help="Port (server.port, default 8000).")] = None,
    set_: Overrides = None,
    set_file: SetFiles = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the plan and command lines, then exit 0; without a GPU here, plan for vllm.gpu "
            f"or else the {DRY_RUN_GPU}.",
        ),
    ] = False,
) -> None:
    """Start the OCR gateway for a profile; for prod, plan and start vLLM first.

    With the vLLM engine (prod, gpu-24g, gpu-12g; cpu-vllm: vLLM's CPU backend on this host) the
    launcher plans `vllm serve` for the GPU (or the host), prints the plan and both command lines,
    starts vLLM, waits for its /health, then starts the gateway; it restarts vLLM if it dies, and
    Ctrl-C drains requests and stops both. With engine.vllm.base_urls set it starts only the
    gateway, in front of those servers.

    Examples:

        ocrserve launch                              # CPU OCR on http://127.0.0.1:8000

        ocrserve launch --host 0.0.0.0 --port 9000 --set engine.onnx.det_workers=2

        OCRSERVE_SERVER__MAX_UPLOAD_MB=100 ocrserve launch --profile local

        ocrserve launch --profile prod               # vLLM + gateway on this machine's GPU

        ocrserve launch --profile prod --dry-run --set vllm.gpu="RTX 4090D"   # plan and commands only

        ocrserve launch --profile cpu-vllm --set engine.model=./my-model   # vLLM's CPU backend, no GPU

        ocrserve launch --profile prod --set engine.vllm.base_urls=\\[http://gpu1:8001] --set vllm.max_num_seqs=9
    """
    user_sets = dedupe_overrides(overlay_overrides(set_file or []) + list(set_ or []))
    overrides = list(user_sets)
    if host is not None:
        overrides.append(f"server.host={host}")
    if port is not None:
        overrides.append(f"server.port={port}")
    config = load_or_exit(profile, overrides)
    Console().print(
        f"[bold]ocrserve[/bold] profile [cyan]{escape(config.profile)}[/cyan] ({escape(str(profile_path(profile)))}): "
        f"engine {config.engine.kind} ({escape(config.engine.model)}) on "
        f"http://{config.server.host}:{config.server.port}"
        + "".join(f"\n  --set {escape(item)}" for item in user_sets),
        soft_wrap=True,
    )
    _check_installed(config, dry_run)
    if manages_vllm(config):
        _launch_with_vllm(config, dry_run, user_sets)
        return
    typer.echo("gateway: " + shlex.join(gateway_command(config, user_sets)))
    if not dry_run:
        try:
            run_gateway(config)
        except AddressTaken as exc:
            raise _fail(exc) from None


def _check_installed(config: Config, dry_run: bool) -> None:
    """What the servers will need, checked before either starts: the engine's section and extra
    (a gateway in front of a vLLM it starts is checked once planned), the store's extra, and for
    a real start the ``vllm`` executable.

    Raises:
        typer.Exit: status 2, the one line that names what is missing.
    """
    try:
        if not manages_vllm(config):
            create_engine(config)  # loads nothing: a bad engine section fails here, not in the server
        check_store(config.store)
    except (ValueError, MissingExtra) as exc:
        raise _fail(exc, 2) from None
    executable = config.vllm.executable
    if manages_vllm(config) and not dry_run and shutil.which(executable) is None:
        install = (
            "install vLLM's CPU backend beside ocrserve (README: cpu-vllm)"
            if config.vllm.device == "cpu"
            else "install vLLM beside ocrserve (pip install 'ocrserve[vllm]')"
        )
        raise _fail(
            f"vllm.executable {executable!r} is not on PATH or not executable: {install} or --set "
            "vllm.executable=PATH; --dry-run plans without it",
            2,
        )


def _launch_with_vllm(config: Config, dry_run: bool, user_sets: list[str]) -> None:
    try:
        plan = _plan(config, dry_run)
    except (ModelError, GpuError, HostError, PlanError, LengthsError) as exc:
        hint = " For ocrserve launch: --set vllm.gpu=NAME or --set vllm.gpu_memory_gib=GIB." * isinstance(exc, GpuError)
        raise _fail(f"{exc}{hint}", 2) from None
    Console().print(render_table(plan, command=False))
    env = "".join(f"{name}={shlex.quote(value)} " for name, value in plan.env.items())
    typer.echo("vLLM:    " + env + shlex.join(vllm_command(config, plan)))
    typer.echo("gateway: " + shlex.join(gateway_command(gateway_config(config, plan), user_sets)))
    if dry_run:
        return
    try:
        raise typer.Exit(run_with_vllm(config, plan))
    except (VllmStartError, AddressTaken) as exc:
        raise _fail(exc) from None


def _plan(config: Config, dry_run: bool) -> Plan:
    """:func:`plan_for`; a dry run on a machine without a GPU plans for :data:`DRY_RUN_GPU` and
    says so (a real launch needs the GPU it plans for).

    Raises:
        ModelError, GpuError, PlanError: as :func:`plan_for`.
    """
    try:
        return plan_for(config)
    except NoGpuFound as exc:
        if not dry_run:
            raise
        err_console.print(
            f"[yellow]note:[/yellow] {escape(str(exc).split(' (')[0])} here; this dry run plans for the "
            f"{DRY_RUN_GPU} (name another with --set vllm.gpu=NAME)",
            soft_wrap=True,
        )
        return plan_for(config.model_copy(update={"vllm": config.vllm.model_copy(update={"gpu": DRY_RUN_GPU})}))


def _fail(exc: Exception | str, code: int = 1) -> typer.Exit:
    err_console.print(f"error: {exc}", highlight=False, markup=False, style="bold red")
    return typer.Exit(code)
