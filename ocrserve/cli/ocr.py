"""``ocrserve ocr``: send files to a running gateway, with a progress bar.

Synchronously (``POST /v1/ocr``, one request per file; the bar counts documents), or with
``--async`` as durable jobs: every
file is submitted first (``POST /v1/jobs``, with an ``Idempotency-Key`` from its sha256 and the
parameters), then each job is followed over its Server-Sent Events (the bar counts pages) and its
result written next to its input. Interrupted and run again, it skips the files whose results
exist and finds the jobs of the others again instead of submitting them anew.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ocrserve.cli.common import documents_or_exit, err_console
from ocrserve.client import OcrClient, RequestFailed, idempotency_key

SUFFIX = {"json": ".json", "text": ".txt", "markdown": ".md"}
#: Job statuses whose result is worth writing (a partial one carries its failed pages' errors).
WRITTEN = ("succeeded", "partial")


class JobFailed(Exception):
    """A job ended without a result to write (failed or cancelled)."""


def _output_path(doc: Path, name: Path, out: Path | None, fmt: str) -> Path:
    """Where a document's result goes: ``out/<name>.<suffix>``, else next to the document."""
    if out is None:
        return doc.with_name(doc.name + SUFFIX[fmt])
    return out / name.with_name(name.name + SUFFIX[fmt])


def _write(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


def _serialize(result: dict | str) -> str:
    return json.dumps(result, ensure_ascii=False, indent=2) if isinstance(result, dict) else result


def _print_results(docs: dict[Path, Path], outcomes: dict[Path, str | Exception], fmt: str) -> None:
    """Print the results that succeeded on stdout. JSON: one document's result as it came, several
    as JSON Lines (one compact object a line, with its ``file``), so ``jq`` reads either. Text and
    markdown: each document after a ``==> FILE <==`` line when there are several (pages within a
    document are separated by a form feed in text)."""
    done = [doc for doc in docs if not isinstance(outcomes[doc], Exception)]
    for doc in done:
        if fmt == "json" and len(docs) > 1:
            typer.echo(json.dumps({"file": str(doc), **json.loads(outcomes[doc])}, ensure_ascii=False))
            continue
        if len(docs) > 1:
            typer.echo(f"==> {doc} <==")
        typer.echo(outcomes[doc])


def _check_reachable(url: str) -> None:
    """Exit with status 2 and a message naming ``url`` when no gateway answers there (connection
    refused, unknown host), instead of retrying every document."""
    try:
        httpx.get(url.rstrip("/") + "/healthz", timeout=5)
    except httpx.TransportError as exc:
        err_console.print(
            f"[red]error:[/red] no gateway answers at {url} ({exc or type(exc).__name__}). Start one with "
            "`ocrserve launch`, or point --url (or OCRSERVE_URL) at yours.",
            highlight=False,
        )
        raise typer.Exit(2) from None


async def _run(
    docs: dict[Path, Path],
    url: str,
    fmt: str,
    out: Path | None,
    concurrency: int,
    api_key: str | None,
    pages: str | None,
) -> dict[Path, str | Exception]:
    outcomes: dict[Path, str | Exception] = {}
    limit = asyncio.Semaphore(concurrency)
    with _progress("documents") as progress:
        task = progress.add_task("", total=len(docs))
        async with OcrClient(url, api_key=api_key) as client:

            async def one(doc: Path) -> None:
                async with limit:
                    try:
                        text = _serialize(await client.ocr(doc, fmt=fmt, pages=pages))
                        if out:
                            _write(_output_path(doc, docs[doc], out, fmt), text)
                        outcomes[doc] = text
                    except (RequestFailed, OSError, Exception) as exc:  # report every failure, keep going
                        outcomes[doc] = exc
                    progress.update(task, advance=1, description=doc.name)

            await asyncio.gather(*(one(d) for d in docs))
    return outcomes


def _progress(unit: str) -> Progress:
    """A progress bar counting ``unit`` (``documents`` or ``pages``)."""
    columns = (
        TextColumn("[bold]OCR"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    return Progress(*columns, console=err_console)


async def _run_jobs(
    docs: dict[Path, Path],
    url: str,
    fmt: str,
    out: Path | None,
    concurrency: int,
    api_key: str | None,
    pages: str | None,
    priority: int | None,
) -> dict[Path, str | Exception]:
    """Submit every document as a job, then follow each and write its result; returns what happened
    to each (``"written"``, ``"skipped"``, or the exception)."""
    outcomes: dict[Path, str | Exception] = {}
    todo = []
    for doc in docs:
        if _output_path(doc, docs[doc], out, fmt).exists():
            outcomes[doc] = "skipped"
        else:
            todo.append(doc)
    limit = asyncio.Semaphore(concurrency)
    with _progress("pages") as progress:
        bar = progress.add_task("submitting", total=0)
        async with OcrClient(url, api_key=api_key) as client:

            async def submit(doc: Path) -> str | None:
                async with limit:
                    try:
                        key = await asyncio.to_thread(idempotency_key, doc, pages=pages, priority=priority)
                        status = await client.submit_job(doc, pages=pages, priority=priority, key=key)
                    except (RequestFailed, OSError, httpx.HTTPError) as exc:
                        outcomes[doc] = exc
                        return None
                    progress.update(bar, total=progress.tasks[bar].total + status["pages_total"])
                    return status["id"]

            async def follow(doc: Path, job_id: str) -> None:
                async with limit:
                    try:
                        target = _output_path(doc, docs[doc], out, fmt)
                        await _follow(client, doc, job_id, fmt, target, lambda: progress.advance(bar))
                        outcomes[doc] = "written"
                    except (RequestFailed, JobFailed, OSError, httpx.HTTPError) as exc:
                        outcomes[doc] = exc
                    progress.update(bar, description=doc.name)

            job_ids = await asyncio.gather(*(submit(d) for d in todo))
            progress.update(bar, description="")
            await asyncio.gather(*(follow(d, j) for d, j in zip(todo, job_ids, strict=True) if j))
    return outcomes


async def _follow(client: OcrClient, doc: Path, job_id: str, fmt: str, target: Path, advance) -> None:
    """Follow one job's events to its end, then write its result to ``target``."""
    final: dict = {}
    async for event, data in client.job_events(job_id):
        if event == "page":
            advance()
        elif event == "done":
            final = data
    if final.get("status") not in WRITTEN:
        raise JobFailed(f"job {job_id} ended {final.get('status')}: {final.get('errors') or 'no result'}")
    result = await client.job_result(job_id, fmt=fmt)
    _write(target, _serialize(result))
    if final["status"] == "partial":
        err_console.print(f"[yellow]partial[/yellow] {doc}: {final['pages_failed']} page(s) failed")


def ocr(
    paths: Annotated[
        list[Path],
        typer.Argument(
            metavar="PATH...", help="Files, directories (searched recursively) or quoted globs ('a/**/*.pdf')."
        ),
    ],
    url: Annotated[
        str, typer.Option(envvar="OCRSERVE_URL", metavar="URL", help="Gateway base URL.")
    ] = "http://127.0.0.1:8000",
    format: Annotated[str, typer.Option("--format", "-f", metavar="FORMAT", help="text, json or markdown.")] = "text",
    out: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Write <name>.<txt|json|md> here instead of printing (subfolders of a directory argument are kept).",
        ),
    ] = None,
    pages: Annotated[str | None, typer.Option(metavar="RANGES", help="Page ranges, e.g. 1-3,5.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Documents in flight at once.")] = 4,
    api_key: Annotated[
        str | None, typer.Option(envvar="OCRSERVE_API_KEY", metavar="KEY", help="API key, if the server wants one.")
    ] = None,
    async_: Annotated[
        bool,
        typer.Option(
            "--async",
            help="Submit durable jobs, follow their progress, write each result next to its input (or in "
            "--out); run again to resume: finished files are skipped, submitted ones not resubmitted.",
        ),
    ] = False,
    priority: Annotated[int | None, typer.Option(min=0, help="With --async: job priority (higher runs first).")] = None,
) -> None:
    """OCR files through a running gateway (start one with `ocrserve launch`).

    Results go to stdout, or with --out to files. On stdout, --format json prints one document's
    result as JSON and several as JSON Lines (one object a line, with its "file"), so `jq` reads
    either; text and markdown put a `==> FILE <==` line before each of several documents, and text
    separates a document's pages with a form feed. The bar counts documents (pages with --async).
    Exit status: 0 all done, 1 some failed, 2 bad arguments or no gateway at --url.

    Examples:

        ocrserve ocr examples/phototest.tif

        ocrserve ocr scans/ --format json --out results/

        ocrserve ocr scans/ --format json | jq -r '.file + ": " + (.usage.pages|tostring)'

        ocrserve ocr report.pdf --pages 1-3 --format markdown --url http://ocr.internal:8000

        ocrserve ocr archive/ --async --format markdown      # archive/a.pdf -> archive/a.pdf.md
    """
    if format not in SUFFIX:
        err_console.print(f"[red]error:[/red] --format must be one of {', '.join(SUFFIX)}")
        raise typer.Exit(2)
    docs = documents_or_exit(paths, out=out)
    if out:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            err_console.print(f"[red]error:[/red] --out {out}: {exc.strerror or exc}", highlight=False)
            raise typer.Exit(2) from None
    _check_reachable(url)
    if async_:
        _report_jobs(asyncio.run(_run_jobs(docs, url, format, out, concurrency, api_key, pages, priority)))
    outcomes = asyncio.run(_run(docs, url, format, out, concurrency, api_key, pages))
    failed = {d: o for d, o in outcomes.items() if isinstance(o, Exception)}
    if not out:
        _print_results(docs, outcomes, format)
    for doc, exc in failed.items():
        err_console.print(f"[red]failed[/red] {doc}: {exc}")
    if out:
        err_console.print(f"wrote {len(docs) - len(failed)} result(s) to {out}")
    raise typer.Exit(1 if failed else 0)


def _report_jobs(outcomes: dict[Path, str | Exception]) -> None:
    """Print what ``--async`` did and exit: 1 if any file failed."""
    failed = {d: o for d, o in outcomes.items() if isinstance(o, Exception)}
    for doc, exc in failed.items():
        err_console.print(f"[red]failed[/red] {doc}: {exc}")
    written = sum(1 for o in outcomes.values() if o == "written")
    skipped = sum(1 for o in outcomes.values() if o == "skipped")
    err_console.print(f"wrote {written} result(s), skipped {skipped} already done, {len(failed)} failed")
    raise typer.Exit(1 if failed else 0)
