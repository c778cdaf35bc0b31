"""``ocrserve ocr``: send files to a running gateway, with a progress bar."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ocrserve.cli.common import err_console
from ocrserve.client import OcrClient, RequestFailed, collect_documents

SUFFIX = {"json": ".json", "text": ".txt", "markdown": ".md"}


def _output_path(doc: Path, out: Path, fmt: str) -> Path:
    return out / (doc.name + SUFFIX[fmt])


def _serialize(result: dict | str) -> str:
    return json.dumps(result, ensure_ascii=False, indent=2) if isinstance(result, dict) else result


async def _run(docs: list[Path], url: str, fmt: str, out: Optional[Path], concurrency: int,
               api_key: Optional[str], pages: Optional[str]) -> dict[Path, str | Exception]:
    outcomes: dict[Path, str | Exception] = {}
    limit = asyncio.Semaphore(concurrency)
    columns = (TextColumn("[bold]OCR"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"))
    with Progress(*columns, console=err_console) as progress:
        task = progress.add_task("", total=len(docs))
        async with OcrClient(url, api_key=api_key) as client:

            async def one(doc: Path) -> None:
                async with limit:
                    try:
                        text = _serialize(await client.ocr(doc, fmt=fmt, pages=pages))
                        if out:
                            _output_path(doc, out, fmt).write_text(text, encoding="utf-8")
                        outcomes[doc] = text
                    except (RequestFailed, OSError, Exception) as exc:  # report every failure, keep going
                        outcomes[doc] = exc
                    progress.update(task, advance=1, description=doc.name)

            await asyncio.gather(*(one(d) for d in docs))
    return outcomes


def ocr(
    paths: Annotated[list[Path], typer.Argument(help="Files or directories (searched recursively).")],
    url: Annotated[str, typer.Option(envvar="OCRSERVE_URL", help="Gateway base URL.")] = "http://127.0.0.1:8000",
    format: Annotated[str, typer.Option("--format", "-f", help="text, json or markdown.")] = "text",
    out: Annotated[Optional[Path], typer.Option(help="Write <name>.<txt|json|md> here instead of printing.")] = None,
    pages: Annotated[Optional[str], typer.Option(help="Page ranges, e.g. 1-3,5.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Documents in flight at once.")] = 4,
    api_key: Annotated[Optional[str], typer.Option(envvar="OCRSERVE_API_KEY", help="API key, if the server wants one.")] = None,
) -> None:
    """OCR files through a running gateway (start one with `ocrserve launch`).

    Examples:

        ocrserve ocr examples/phototest.tif

        ocrserve ocr scans/ --format json --out results/

        ocrserve ocr report.pdf --pages 1-3 --format markdown --url http://ocr.internal:8000
    """
    if format not in SUFFIX:
        err_console.print(f"[red]error:[/red] --format must be one of {', '.join(SUFFIX)}")
        raise typer.Exit(2)
    try:
        docs = collect_documents(paths)
    except FileNotFoundError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if not docs:
        err_console.print("[red]error:[/red] no documents found")
        raise typer.Exit(2)
    if out:
        out.mkdir(parents=True, exist_ok=True)
    outcomes = asyncio.run(_run(docs, url, format, out, concurrency, api_key, pages))
    failed = {d: o for d, o in outcomes.items() if isinstance(o, Exception)}
    if not out:
        for doc in docs:
            if not isinstance(outcomes[doc], Exception):
                if len(docs) > 1:
                    typer.echo(f"==> {doc} <==")
                typer.echo(outcomes[doc])
    for doc, exc in failed.items():
        err_console.print(f"[red]failed[/red] {doc}: {exc}")
    if out:
        err_console.print(f"wrote {len(docs) - len(failed)} result(s) to {out}")
    raise typer.Exit(1 if failed else 0)
