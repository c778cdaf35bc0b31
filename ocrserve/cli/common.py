"""Helpers shared by CLI commands."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console

from ocrserve.config import Config, ConfigError, load_config
from ocrserve.extras import MissingExtra, require
from ocrserve.inputs import collect_documents

#: stderr: errors and notes are single lines that a pipe, a log file or CI keeps whole (the terminal
#: wraps them); progress bars still fit the terminal's width.
err_console = Console(stderr=True, soft_wrap=True)

#: The repeatable ``--set key=value`` option of the commands that load a profile.
Overrides = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE", help="Override any key: --set engine.onnx.det_workers=2 (repeatable)"),
]


#: The repeatable ``--set-file PATH`` option: a YAML overlay of keys, as ``ocrserve bench`` writes.
SetFiles = Annotated[
    list[Path] | None,
    typer.Option(
        "--set-file",
        metavar="YAML",
        help="Apply a YAML overlay of keys (e.g. recommended.yaml from `ocrserve bench`) before --set (repeatable)",
    ),
]


def require_extra(extra: str, purpose: str) -> None:
    """Check an extra before a command starts its work (:func:`ocrserve.extras.require`).

    Raises:
        typer.Exit: the extra is not installed (status 2; the line names it and its ``pip install``).
    """
    try:
        require(extra, purpose)
    except MissingExtra as exc:
        err_console.print(f"error: {exc}", highlight=False, markup=False, style="bold red")
        raise typer.Exit(2) from None


def overlay_overrides(paths: list[Path]) -> list[str]:
    """The ``key=value`` overrides of YAML overlays (nested mappings, e.g. ``vllm: {max_num_seqs: 16}``).

    Raises:
        typer.Exit: a file that cannot be read or is not a mapping (status 2, the reason printed).
    """
    overrides: list[str] = []
    for path in paths:
        try:
            tree = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            err_console.print(f"[bold red]error:[/bold red] --set-file {path}: {exc}")
            raise typer.Exit(2) from None
        if not isinstance(tree, dict):
            err_console.print(f"[bold red]error:[/bold red] --set-file {path}: expected a mapping of keys")
            raise typer.Exit(2)
        overrides += _flatten(tree, "")
    return overrides


def _flatten(tree: dict, prefix: str) -> list[str]:
    items = []
    for key, value in tree.items():
        if isinstance(value, dict):
            items += _flatten(value, f"{prefix}{key}.")
        else:
            items.append(f"{prefix}{key}={value if isinstance(value, str) else json.dumps(value)}")
    return items


def documents_or_exit(paths: list[Path], *, out: Path | None = None) -> dict[Path, Path]:
    """:func:`ocrserve.inputs.collect_documents` of ``paths`` (never searching the output folder
    ``out``), or print why not and exit with status 2 (a path that does not exist, a glob that
    matches nothing, two documents of one name, no document at all). The other files found are
    left, with a note saying how many of each kind."""
    skipped: Counter[str] = Counter()
    try:
        found = collect_documents(paths, skipped, exclude=out)
    except (FileNotFoundError, ValueError) as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if skipped:
        kinds = ", ".join(f"{count} {suffix or 'without a suffix'}" for suffix, count in skipped.most_common())
        err_console.print(
            f"note: {sum(skipped.values())} files found are not documents and are left ({kinds}); "
            "name a file to read it whatever its suffix"
        )
    if not found:
        err_console.print("[red]error:[/red] no documents found")
        raise typer.Exit(2)
    return found


def load_or_exit(profile: str, overrides: list[str]) -> Config:
    """Load a profile, or print why not and exit with status 2."""
    try:
        return load_config(profile, overrides)
    except ConfigError as exc:
        err_console.print(f"[bold red]error:[/bold red] {exc}")
        raise typer.Exit(2) from None
