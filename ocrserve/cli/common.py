"""Helpers shared by CLI commands."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from ocrserve.config import Config, ConfigError, load_config

err_console = Console(stderr=True)

#: The repeatable ``--set key=value`` option of the commands that load a profile.
Overrides = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE", help="Override any key: --set engine.onnx.det_workers=2 (repeatable)"),
]


def load_or_exit(profile: str, overrides: list[str]) -> Config:
    """Load a profile, or print why not and exit with status 2."""
    try:
        return load_config(profile, overrides)
    except ConfigError as exc:
        err_console.print(f"[bold red]error:[/bold red] {exc}")
        raise typer.Exit(2) from None
