"""``ocrserve launch``: start the gateway (and, for prod, the engine it plans)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

from ocrserve.cli.common import load_or_exit
from ocrserve.launcher import gateway_command, run_gateway


def launch(
    profile: Annotated[str, typer.Option(help="Profile name in configs/ (local, debug, prod, ...) or a YAML path.")] = "local",
    host: Annotated[Optional[str], typer.Option(help="Bind address (server.host).")] = None,
    port: Annotated[Optional[int], typer.Option(help="Port (server.port).")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override any key: --set engine.onnx.det_workers=2")] = [],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would start, then exit 0.")] = False,
) -> None:
    """Start the OCR gateway for a profile.

    Examples:

        ocrserve launch                              # CPU OCR on http://127.0.0.1:8000

        ocrserve launch --host 0.0.0.0 --port 9000 --set engine.onnx.det_workers=2

        OCRSERVE_SERVER__MAX_UPLOAD_MB=100 ocrserve launch --profile local

        ocrserve launch --profile prod --dry-run     # print the planned vLLM command
    """
    overrides = list(set_)
    if host is not None:
        overrides.append(f"server.host={host}")
    if port is not None:
        overrides.append(f"server.port={port}")
    config = load_or_exit(profile, overrides)
    console = Console()
    console.print(f"[bold]ocrserve[/bold] profile [cyan]{config.profile}[/cyan]: engine {config.engine.kind} "
                  f"({config.engine.model}) on http://{config.server.host}:{config.server.port}")
    if dry_run:
        console.print("gateway: " + " ".join(gateway_command(config)))
        return
    run_gateway(config)
