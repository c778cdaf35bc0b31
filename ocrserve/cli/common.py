"""Helpers shared by CLI commands."""

from __future__ import annotations

import typer
from rich.console import Console

from ocrserve.config import Config, ConfigError, load_config

err_console = Console(stderr=True)


def load_or_exit(profile: str, overrides: list[str]) -> Config:
    """Load a profile, or print why not and exit with status 2."""
    try:
        return load_config(profile, overrides)
    except ConfigError as exc:
        err_console.print(f"[bold red]error:[/bold red] {exc}")
        raise typer.Exit(2) from None
