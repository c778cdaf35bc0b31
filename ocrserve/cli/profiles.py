"""``ocrserve profiles``: list the shipped profiles."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ocrserve.config import ConfigError, list_profiles, load_config


def profiles() -> None:
    """List the profiles shipped in the package (ocrserve/profiles/) with their engine, model and pixel budget.

    Any other YAML file works too: ocrserve launch --profile path/to/mine.yaml

    Examples:

        ocrserve profiles
    """
    table = Table("profile", "engine", "model", "pixel budget", "description")
    for name in list_profiles():
        try:
            cfg = load_config(name, environ={})
        except ConfigError as exc:
            table.add_row(name, "-", "-", "-", f"[red]{exc}[/red]")
            continue
        pre = cfg.preprocess
        table.add_row(
            name,
            cfg.engine.kind,
            cfg.engine.model,
            f"{pre.min_pixels:,}..{pre.max_pixels:,} px, factor {pre.factor}",
            cfg.description,
        )
    Console().print(table)
