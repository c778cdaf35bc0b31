"""``ocrserve batch``: OCR many documents on Ray Data, no gateway; resumable (see :mod:`ocrserve.batch`)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ocrserve.batch.output_folder import MANIFEST, ManifestEntry
from ocrserve.cli.common import Overrides, documents_or_exit, err_console, load_or_exit, require_extra
from ocrserve.cli.ocr import SUFFIX
from ocrserve.engines import create_engine
from ocrserve.errors import BadRequest
from ocrserve.preprocess import page_ranges

if TYPE_CHECKING:
    from ocrserve.batch.ray_pipeline import Summary

#: Result file suffix of each ``--format``: those of ``ocrserve ocr --out``, and JSON Lines.
FORMATS = {**SUFFIX, "jsonl": ".jsonl"}
#: Failed documents the closing summary names (the manifest has them all).
SHOWN_FAILURES = 10


def batch(
    inputs: Annotated[
        list[str],
        typer.Argument(
            metavar="INPUT...", help="Files, folders (searched recursively) or quoted globs ('a/**/*.pdf')."
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            metavar="DIR", help="Results (same relative paths as `ocrserve ocr --out`), manifest.jsonl, done records."
        ),
    ],
    profile: Annotated[
        str, typer.Option(metavar="NAME|PATH", help="Profile: its engine, limits and pixel budget.")
    ] = "local",
    ray_address: Annotated[
        str,
        typer.Option(
            "--ray",
            metavar="auto|local|ADDRESS",
            help="auto: RAY_ADDRESS, else a cluster started here (`ray start`), else a new local Ray; "
            "local: a new local Ray; or a cluster's address (host:6379, ray://host:10001).",
        ),
    ] = "auto",
    format: Annotated[
        str, typer.Option("--format", "-f", metavar="FORMAT", help="json, text, markdown or jsonl (a page a line).")
    ] = "json",
    pages: Annotated[
        str | None, typer.Option(metavar="RANGES", help="Page ranges of every document, e.g. 1-3,5.")
    ] = None,
    actors: Annotated[
        int, typer.Option(min=0, help="OCR actors; 0: one per 2 CPUs of the cluster (one for vllm replicas).")
    ] = 0,
    retries: Annotated[
        int, typer.Option(min=0, help="Restarts of a dead OCR actor, and retries of the tasks it or a worker lost.")
    ] = 3,
    set_: Overrides = None,
) -> None:
    """OCR many documents on Ray Data: no gateway; every document once; run it again to finish.

    The pages of every document are decoded by CPU tasks (the gateway's preprocessor, limits and
    pixel budget) and read by a pool of OCR actors (the profile's engine: the embedded ONNX engine,
    or with engine.kind vllm the replicas of engine.vllm.base_urls). Each result is written
    atomically, and manifest.jsonl gets one line per document (document, pages, status, errors,
    seconds, engine). A document whose result exists for the same content, pages, pixel budget and
    model is skipped, so a run killed at any moment is finished by running it again. A page that
    fails is recorded in its document's result and the manifest; a document that fails (unreadable,
    over a limit, every page failed) gets no result and is tried again by the next run.
    Exit status: 0 every document done or skipped, 1 some failed, 2 bad arguments; 130 (Ctrl-C)
    and 143 (SIGTERM) stop it with what is recorded kept.

    Examples:

        ocrserve batch scans/ --out results/                      # a local Ray on this machine's cores

        ocrserve batch 'archive/**/*.pdf' --out ocr/ --format markdown --pages 1

        ocrserve batch scans/ --out results/ --ray ray://head.internal:10001 --actors 16

        ocrserve batch scans/ --out results/ --profile replicas.yaml   # engine.kind vllm + engine.vllm.base_urls
    """
    if format not in FORMATS:
        err_console.print(f"[red]error:[/red] --format must be one of {', '.join(FORMATS)}")
        raise typer.Exit(2)
    require_extra("ray", "ocrserve batch")
    if pages and pages.strip():
        _check_pages(pages)
    if out.exists() and not out.is_dir():
        err_console.print(f"[red]error:[/red] --out {escape(str(out))} is a file; name a folder", highlight=False)
        raise typer.Exit(2)
    config = load_or_exit(profile, list(set_ or []))
    try:
        create_engine(config)  # a setting the engine cannot run with fails here, before Ray starts
    except ValueError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    docs = documents_or_exit([Path(i) for i in inputs], out=out)
    try:
        from ocrserve.batch.ray_pipeline import Options, ray_cluster, run_batch
    except ImportError as exc:
        err_console.print(f"[red]error:[/red] ocrserve batch needs Ray: pip install 'ocrserve\\[ray]' ({exc})")
        raise typer.Exit(2) from None
    outputs = {doc: str(name.with_name(name.name + FORMATS[format])) for doc, name in docs.items()}
    options = Options(fmt=format, pages=pages, actors=actors, retries=retries)
    recorded: list[ManifestEntry] = []  # this run's manifest lines (the file holds the last run's until it starts)
    try:
        with ray_cluster(ray_address), _signals_as_interrupt() as received:

            def record(entry: ManifestEntry) -> None:
                recorded.append(entry)
                if received:  # a signal whose exception Python swallowed (see _signals_as_interrupt)
                    raise _interrupt(received[0])

            summary = run_batch(outputs, out, config, options, on_entry=record, console=err_console)
    except (ConnectionError, OSError, ValueError) as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    except KeyboardInterrupt as stop:
        err_console.print(
            f"interrupted: {len(recorded)} of {len(outputs)} documents recorded in {escape(str(out / MANIFEST))}; "
            "run the same command again to finish the rest",
            highlight=False,
        )
        raise typer.Exit(128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)) from None
    err_console.print(_summary_table(summary))
    failed = [e for e in summary.entries if e.status == "failed"]
    for entry in failed[:SHOWN_FAILURES]:
        first = entry.errors[0] if entry.errors else {}
        err_console.print(f"[red]failed[/red] {escape(entry.document)}: {escape(str(first.get('detail')))}")
    err_console.print(f"manifest: {escape(str(out / MANIFEST))}", highlight=False)
    raise typer.Exit(1 if failed else 0)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises :class:`KeyboardInterrupt` (see :func:`_signals_as_interrupt`)."""


def _interrupt(signum: int) -> KeyboardInterrupt:
    """The exception a signal stops the run with: :class:`Terminated` for SIGTERM."""
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM (``kill``, Kubernetes, Slurm) end the run alike: what is recorded stays,
    the rest is for the next run, and the exit status is 128 + the signal (130, 143). Set once Ray
    has started, whose own SIGTERM handler would print a crash trace and exit without a word.

    Yields the signals received. The handler raises at once, but Python swallows an exception
    raised while it runs a garbage-collection callback ("Exception ignored in ..."), and the run
    went on to its end (seen in 1 of 2 test runs); so the caller raises again at its next step.
    """
    received: list[int] = []

    def stop(signum: int, frame) -> None:
        received.append(signum)
        raise _interrupt(signum)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _check_pages(spec: str) -> None:
    """Exit with status 2 on ``--pages`` that no document could satisfy (malformed, empty or below
    1), before Ray starts; a page beyond a document fails that document only."""
    try:
        page_ranges(spec)
    except BadRequest as exc:
        err_console.print(f"[red]error:[/red] --pages: {escape(exc.detail)}", highlight=False)
        raise typer.Exit(2) from None


def _summary_table(summary: Summary) -> Table:
    """The closing summary: documents by outcome, pages, failures, time and pages/min."""
    table = Table(title="ocrserve batch", show_header=False)
    table.add_column(justify="left")
    table.add_column(justify="right")
    rows = [
        ("documents", len(summary.entries)),
        ("succeeded", summary.count("succeeded")),
        ("partial (some pages failed)", summary.count("partial")),
        ("skipped (done before)", summary.count("skipped")),
        ("failed", summary.count("failed")),
        ("pages OCR'd", summary.pages),
        ("pages failed", summary.failed_pages),
        ("seconds (OCR / all)", f"{summary.ocr_seconds:.1f} / {summary.seconds:.1f}"),
        ("pages/min", f"{summary.pages_per_min:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    return table
