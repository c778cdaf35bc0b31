"""``ocrserve ocr``: send files to a running gateway, with a progress bar.

Synchronously (``POST /v1/ocr``, one request per file; the bar counts documents), or with
``--async`` as durable jobs. Synchronously with ``--out``, each result is written atomically with
its done record (:class:`ocrserve.batch.output_folder.OutputFolder`: the input's sha256, format and
pages), and a run again skips the documents whose result is there as written; every run ends
with one summary line (done, skipped, failed, not done) and how to resume. With ``--async``, every
file is submitted first (``POST /v1/jobs``, with an ``Idempotency-Key`` from its sha256 and the
parameters), then each job is followed over its Server-Sent Events (the bar counts pages) and its
result written next to its input. Interrupted and run again, it skips the files whose results
exist and finds the jobs of the others again instead of submitting them anew.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ocrserve.batch.output_folder import ManifestEntry, OutputFolder, page_errors, render, write_atomic
from ocrserve.cli.common import documents_or_exit, err_console
from ocrserve.client import OcrClient, RequestFailed, idempotency_key

SUFFIX = {"json": ".json", "text": ".txt", "markdown": ".md"}
#: Job statuses whose result is worth writing (a partial one carries its failed pages' errors).
WRITTEN = ("succeeded", "partial")
#: Exit status when the gateway stops answering mid-run (connection refused or reset, after retries),
#: or has no OCR engine up (503 engine-down or engine-unavailable, after retries).
GATEWAY_GONE = 3
#: Exit status after Ctrl-C (128 + SIGINT).
INTERRUPTED = 130


class JobFailed(Exception):
    """A job ended without a result to write (failed or cancelled)."""


class GatewayGone(Exception):
    """The run cannot go on: the gateway stopped answering (a document's request failed on the
    connection after its retries, and ``GET /healthz`` got no answer either), or it has no OCR
    engine up (503 after the retries); the message says which."""


@dataclass
class Tally:
    """What a synchronous run did so far, counted as each document ends (read after Ctrl-C too).

    Attributes:
        total: documents of the run.
        done: results received (written with --out), partial ones included.
        skipped: results already in --out for the same input and options.
        failed: documents the gateway refused or failed, or whose result could not be written.
        retry: done ones with pages failed for a transient reason (written, but done again next run).
    """

    total: int
    done: int = 0
    skipped: int = 0
    failed: int = 0
    retry: int = 0

    def line(self, out: Path | None) -> str:
        """The closing summary, e.g. ``12 done, 30 skipped (already in res), 3 failed; run the same
        command again to retry the failed``; documents not attempted are ``not done``."""
        not_done = self.total - self.done - self.skipped - self.failed
        parts = [f"{self.done} done" + (f" ({self.retry} with pages to retry)" if self.retry else "")]
        if out is not None:
            parts.append(f"{self.skipped} skipped (already in {out})")
        parts.append(f"{self.failed} failed")
        if not_done:
            parts.append(f"{not_done} not done")
        line = ", ".join(parts)
        todo = [
            what for what, n in (("retry the failed", self.failed + self.retry), ("finish the rest", not_done)) if n
        ]
        if todo and out is not None:
            line += f"; run the same command again to {' and '.join(todo)}"
        elif todo:
            line += "; with --out DIR, a run again skips the documents done"
        return line


def _output_path(doc: Path, name: Path, out: Path | None, fmt: str) -> Path:
    """Where a document's result goes: ``out/<name>.<suffix>``, else next to the document."""
    if out is None:
        return doc.with_name(doc.name + SUFFIX[fmt])
    return out / name.with_name(name.name + SUFFIX[fmt])


def _write(target: Path, text: str) -> None:
    write_atomic(target, text)


def _serialize(result: dict | str) -> str:
    return json.dumps(result, ensure_ascii=False, indent=2) if isinstance(result, dict) else result


def _print_results(docs: dict[Path, Path], outcomes: dict[Path, str | Exception], fmt: str) -> None:
    """Print the results that succeeded on stdout. JSON: one document's result as it came, several
    as JSON Lines (one compact object a line, with its ``file``), so ``jq`` reads either. Text and
    markdown: each document after a ``==> FILE <==`` line when there are several (pages within a
    document are separated by a form feed in text)."""
    done = [doc for doc in docs if isinstance(outcomes.get(doc), str)]
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
    force: bool,
    tally: Tally,
    outcomes: dict[Path, str | Exception],
) -> None:
    """OCR each document (``concurrency`` at once), filling ``outcomes`` (the rendered result,
    ``"skipped"`` or the exception) and ``tally`` as each ends. With ``out``, a document whose
    result is there for the same input and options is skipped (unless ``force``), and each result
    is written atomically with its done record.

    Raises:
        GatewayGone: the gateway stopped answering; the documents in flight are abandoned.
    """
    folder = OutputFolder(out) if out is not None else None
    pending = iter(docs)
    with _progress("documents") as progress:
        task = progress.add_task("", total=len(docs))
        async with OcrClient(url, api_key=api_key) as client:

            async def one(doc: Path) -> None:
                output = str(_output_path(doc, docs[doc], Path(), fmt))
                key = await asyncio.to_thread(idempotency_key, doc, format=fmt, pages=pages) if folder else ""
                if folder and not force and folder.done(output, key):
                    outcomes[doc] = "skipped"
                    tally.skipped += 1
                    return
                try:
                    result = await client.ocr(doc, fmt="json", pages=pages)
                except RequestFailed as exc:
                    if exc.engine_down:  # after its retries: every other document would get it too
                        raise GatewayGone(f"the gateway at {url} has no OCR engine up ({exc})") from exc
                    raise
                except httpx.TransportError as exc:
                    if not await client.answers():
                        raise GatewayGone(
                            f"the gateway at {url} stopped answering ({exc or type(exc).__name__})"
                        ) from exc
                    outcomes[doc] = exc
                    tally.failed += 1
                    return
                entry = ManifestEntry(str(doc), output, "succeeded", key=key)
                outcomes[doc] = _keep(result, fmt, folder, entry)
                tally.done += 1
                tally.retry += folder is not None and not entry.final

            async def worker() -> None:
                for doc in pending:
                    try:
                        await one(doc)
                    except GatewayGone:
                        raise
                    except Exception as exc:  # report every failure (refused, failed, not written), keep going
                        outcomes[doc] = exc
                        tally.failed += 1
                    progress.update(task, advance=1, description=doc.name)

            workers = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(docs)))]
            try:
                finished, _ = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
                for work in finished:
                    work.result()  # GatewayGone, if that is how it ended
            finally:
                for work in workers:
                    work.cancel()
                await asyncio.gather(*workers, return_exceptions=True)


def _keep(result: dict, fmt: str, folder: OutputFolder | None, entry: ManifestEntry) -> str:
    """``result`` rendered as ``fmt``, written under ``folder`` (when given) at ``entry.output``
    with its done record when no page failed for a transient reason.

    Raises:
        RequestFailed: every page failed (nothing written; the first page's problem).
        OSError: the write failed.
    """
    pages = result["pages"]
    errors = page_errors(pages)
    if pages and len(errors) == len(pages):
        raise RequestFailed(pages[0]["error"].get("status") or 500, pages[0]["error"])
    text = render(result, fmt)
    if folder is not None:
        entry.status = "partial" if errors else "succeeded"
        entry.pages, entry.errors = len(pages), errors
        entry.seconds = float(result.get("usage", {}).get("seconds", 0.0))
        entry.engine = result.get("model", "")
        folder.write_text(entry, text)
    return text


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
    force: bool = False,
) -> dict[Path, str | Exception]:
    """Submit every document as a job, then follow each and write its result; returns what happened
    to each (``"written"``, ``"skipped"`` (its result exists; not with ``force``), or the exception)."""
    outcomes: dict[Path, str | Exception] = {}
    todo = []
    for doc in docs:
        if not force and _output_path(doc, docs[doc], out, fmt).exists():
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
            help="Write <name>.<txt|json|md> here instead of printing (subfolders of a directory argument are "
            "kept); a run again skips the results already there (see --force).",
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
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="OCR every document again, even those whose result is already written (in --out, or with --async).",
        ),
    ] = False,
) -> None:
    """OCR files through a running gateway (start one with `ocrserve launch`).

    Results go to stdout, or with --out to files. On stdout, --format json prints one document's
    result as JSON and several as JSON Lines (one object a line, with its "file"), so `jq` reads
    either; text and markdown put a `==> FILE <==` line before each of several documents, and text
    separates a document's pages with a form feed. The bar counts documents (pages with --async).

    With --out, a run again (after Ctrl-C, failures, new files) skips each document whose result is
    already there for the same file content, --format and --pages (written whole, with a done
    record under DIR/.ocrserve-batch; a result edited since is made again); --force redoes them.
    Every run ends with one line on stderr: done, skipped, failed, not done, and how to resume.

    Exit status: 0 all done or skipped, 1 some failed, 2 bad arguments or no gateway at --url,
    3 the gateway stopped answering mid-run (the rest is not done), 130 Ctrl-C.

    Examples:

        ocrserve ocr examples/phototest.tif

        ocrserve ocr scans/ --format json --out results/

        ocrserve ocr scans/ --format json --out results/     # again: skips what is done, does the rest

        ocrserve ocr scans/ --format json --out results/ --force   # OCR everything again

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
        _report_jobs(asyncio.run(_run_jobs(docs, url, format, out, concurrency, api_key, pages, priority, force)))
    tally, outcomes = Tally(len(docs)), {}
    status, stopped = 0, ""
    try:
        asyncio.run(_run(docs, url, format, out, concurrency, api_key, pages, force, tally, outcomes))
    except GatewayGone as gone:
        err_console.print(
            f"[red]error:[/red] {escape(str(gone))}; stopping here.",
            highlight=False,
            soft_wrap=True,
        )
        status = GATEWAY_GONE
    except KeyboardInterrupt:
        status, stopped = INTERRUPTED, "interrupted: "
    failed = {d: o for d, o in outcomes.items() if isinstance(o, Exception)}
    if not out:
        _print_results(docs, outcomes, format)
    for doc, exc in failed.items():
        err_console.print(f"[red]failed[/red] {escape(str(doc))}: {escape(str(exc))}", highlight=False)
    err_console.print(escape(stopped + tally.line(out)), highlight=False, soft_wrap=True)  # one line, however wide
    raise typer.Exit(status or (1 if failed else 0))


def _report_jobs(outcomes: dict[Path, str | Exception]) -> None:
    """Print what ``--async`` did and exit: 1 if any file failed."""
    failed = {d: o for d, o in outcomes.items() if isinstance(o, Exception)}
    for doc, exc in failed.items():
        err_console.print(f"[red]failed[/red] {doc}: {exc}")
    written = sum(1 for o in outcomes.values() if o == "written")
    skipped = sum(1 for o in outcomes.values() if o == "skipped")
    err_console.print(f"wrote {written} result(s), skipped {skipped} already done, {len(failed)} failed")
    raise typer.Exit(1 if failed else 0)
