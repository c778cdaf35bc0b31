"""The stages of :mod:`ocrserve.batch.ray_stages` on Ray Data, with retries, a progress bar and a summary.

A run is two Ray Data executions:

1. **Inspect** (CPU tasks, one per document): hash, inspect, select pages, resume key, done
   record. The driver learns every document's pages before any is decoded: skipped and failed
   documents go to the manifest at once, the progress bar gets its total, and a run with nothing
   left to do starts no OCR actor at all.
2. **Pages**: chunks of :data:`~ocrserve.preprocess.PAGES_PER_TASK` pages of the documents left
   -> decode (CPU tasks) -> OCR (an actor pool, one engine per actor) -> the driver, which
   assembles each document as its last page arrives and writes its result, its done record and
   its manifest line. Results are written by the driver, so ``--out`` needs to exist on the
   driver's machine only (the inputs must be readable by every node).

Fault tolerance is Ray's: a decode task whose worker dies is retried (``max_retries``); an OCR
actor that dies is restarted (``max_restarts``) and the batches it held are retried on it
(``max_task_retries``). The driver takes each page once (a retried task's duplicate is dropped)
and writes each document once. A run whose pipeline fails after its retries records the documents
not done as failed, and a later run does them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import ray
from ray.util.annotations import RayDeprecationWarning
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ocrserve.batch.output_folder import MANIFEST, Manifest, ManifestEntry, OutputFolder
from ocrserve.batch.ray_stages import Assembler, OcrWorker, decode_row, inspect_row
from ocrserve.config import Config
from ocrserve.engines import create_engine
from ocrserve.preprocess import PAGES_PER_TASK

log = logging.getLogger(__name__)
#: CPUs per OCR actor of the embedded engine (the default pool has one per this many CPUs).
CPUS_PER_ACTOR = 2
#: The port of a Ray head's GCS when an address names none (``ray start --head`` default).
DEFAULT_RAY_PORT = 6379


@dataclass(frozen=True)
class Options:
    """How a run reads and where it runs.

    Attributes:
        fmt: the results' format: ``json``, ``text``, ``markdown`` or ``jsonl``.
        pages: page ranges (``"1-3,5"``) selected in every document, or None for all.
        actors: OCR actors; 0: one per 2 CPUs of the cluster with the embedded engine, one with
            an engine of replicas (``vllm``: each actor's engine keeps every replica's slots busy).
        retries: restarts of a dead OCR actor, and retries of a task or an actor call it lost.
    """

    fmt: str = "json"
    pages: str | None = None
    actors: int = 0
    retries: int = 3


@dataclass
class Summary:
    """What a run did.

    Attributes:
        entries: every document's manifest entry, in the order they ended.
        seconds: the run's wall time, seconds.
        ocr_seconds: wall time of the pages execution (OCR actors' start included), seconds; 0 when
            nothing was left to do.
    """

    entries: list[ManifestEntry] = field(default_factory=list)
    seconds: float = 0.0
    ocr_seconds: float = 0.0

    def count(self, status: str) -> int:
        """Documents of ``status`` (``succeeded``, ``partial``, ``failed``, ``skipped``)."""
        return sum(1 for e in self.entries if e.status == status)

    @property
    def pages(self) -> int:
        """Pages the engine read in this run (0 when every document was skipped)."""
        return sum(e.ocr_pages for e in self.entries)

    @property
    def failed_pages(self) -> int:
        """Pages that failed in this run (decoding or engine)."""
        return sum(len([x for x in e.errors if x["page"]]) for e in self.entries if e.status != "skipped")

    @property
    def pages_per_min(self) -> float:
        """Engine pages per minute of the pages execution."""
        return 60 * self.pages / self.ocr_seconds if self.ocr_seconds else 0.0


@contextlib.contextmanager
def ray_cluster(address: str) -> Iterator[None]:
    """Connect to Ray for the block: ``auto`` (``RAY_ADDRESS``, else a cluster started on this
    machine with ``ray start``, else a new local one), ``local`` (always a new local one), or an
    address (``host:6379``, ``ray://host:10001``). A Ray this process already joined is used as it
    is and left running; one started here is shut down.

    Raises:
        ConnectionError: no Ray answers at ``address`` or ``RAY_ADDRESS`` (checked before Ray,
            which would retry for minutes).
    """
    if ray.is_initialized():
        yield
        return
    if address == "auto" and os.environ.get("RAY_ADDRESS", "auto") not in ("", "auto", "local"):
        _check_reachable(os.environ["RAY_ADDRESS"], "RAY_ADDRESS=")
    elif address not in ("auto", "local"):
        _check_reachable(address)
    ray.init(address=None if address == "auto" else address, logging_level=logging.WARNING)
    # the command shows its own bar; Ray Data's progress and logs stay in the session's ray-data log
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    try:
        yield
    finally:
        ray.shutdown()


def _check_reachable(address: str, named: str = "", timeout_s: float = 5.0) -> None:
    """Raise ConnectionError unless a gRPC server (a Ray head's GCS, or its Ray Client server for
    ``ray://``) answers at ``address`` (``host:port`` or ``ray://host:port``; port 6379 when none)
    within ``timeout_s``: a TCP connection, then an HTTP/2 handshake, which a port held by anything
    else (a web server) fails. ``named`` prefixes the address in the message (``RAY_ADDRESS=``)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host, port = (host, port) if port.isdigit() else (address.removeprefix("ray://"), str(DEFAULT_RAY_PORT))
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(f"no Ray cluster answers at {named}{address}: {exc.strerror or exc}") from None
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise ConnectionError(
                f"{named}{address} answers, but not as Ray: no gRPC server there within {timeout_s:g} s"
            ) from None


def run_batch(
    documents: dict[Path, str],
    out: Path,
    config: Config,
    options: Options = Options(),
    *,
    on_entry: Callable[[ManifestEntry], None] = lambda entry: None,
    console: Console | None = None,
) -> Summary:
    """OCR ``documents`` on the Ray this process is connected to (see :func:`ray_cluster`).

    Args:
        documents: input file -> its result's path relative to ``out``.
        out: the output folder: results, done records, ``manifest.jsonl``.
        config: the profile (engine, preprocess limits and pixel budget).
        options: see :class:`Options`.
        on_entry: called with each document's manifest entry as it is written.
        console: where the progress bar goes (None: no bar).

    Returns:
        The run's :class:`Summary`.

    Raises:
        ValueError: an engine this configuration cannot build (the message names the key), or
            more OCR actors than the cluster has CPUs to spare beside the decoding tasks.
        OSError: ``out`` or its manifest cannot be written.
    """
    started = time.perf_counter()
    worker_config = _worker_config(config)
    engine = create_engine(worker_config)  # not started: its model id and slots
    options = dataclasses.replace(options, actors=_actors(options.actors, config))
    folder = OutputFolder(out)
    manifest = Manifest(folder.root / MANIFEST)
    summary = Summary()

    def record(entry: ManifestEntry) -> None:
        manifest.add(entry)
        summary.entries.append(entry)
        on_entry(entry)

    try:
        with _progress(console) as progress:
            todo = _inspect(documents, folder, config, engine.model, options, progress, record)
            if todo:
                ocr_started = time.perf_counter()
                calls = _calls_per_actor(engine.slots)
                _ocr(todo, folder, worker_config, engine.model, options, calls, progress, record)
                summary.ocr_seconds = time.perf_counter() - ocr_started
    finally:
        manifest.close()
    summary.seconds = time.perf_counter() - started
    return summary


@dataclass(frozen=True)
class _Todo:
    """A document inspected and not done before: where its result goes, its resume key, its
    pickled :class:`~ocrserve.preprocess.DocumentInfo` and its selected pages (0-based)."""

    document: str
    output: str
    key: str
    info: bytes
    indices: list[int]


def _inspect(
    documents: dict[Path, str],
    folder: OutputFolder,
    config: Config,
    model: str,
    options: Options,
    progress: Progress,
    record: Callable[[ManifestEntry], None],
) -> list[_Todo]:
    """Execution 1: every document inspected; records the failed ones and those whose done record
    holds their resume key (skipped), returns the others."""
    items = [{"document": str(path), "output": output} for path, output in documents.items()]
    bar = progress.add_task("inspect", total=len(items))
    kwargs = {"config": config, "model": model, "pages": options.pages}
    with _remote_args_allowed():
        rows = ray.data.from_items(items).map(inspect_row, fn_kwargs=kwargs, max_retries=options.retries)
    todo = []
    for row in rows.iter_rows():
        progress.advance(bar)
        if row["failed"]:
            record(ManifestEntry.from_json(row["failed"]))
        elif (done := folder.done(row["output"], row["key"])) is not None:
            record(done.skipped(row["document"]))
        else:
            indices = [int(i) for i in row["indices"]]
            todo.append(_Todo(row["document"], row["output"], row["key"], row["info"], indices))
    return todo


def _ocr(
    todo: list[_Todo],
    folder: OutputFolder,
    config: Config,
    model: str,
    options: Options,
    calls: int,
    progress: Progress,
    record: Callable[[ManifestEntry], None],
) -> None:
    """Execution 2: the pages of the documents in ``todo`` decoded, OCR'd and assembled; each
    document's result written and its entry recorded as its last page arrives. Each OCR actor
    works on ``calls`` pages at once (a batch of one page per call)."""
    assembler = Assembler(model)
    for doc in todo:
        assembler.expect(
            ManifestEntry(doc.document, doc.output, "", len(doc.indices), engine=model, key=doc.key), doc.indices
        )
    chunks = [
        {"document": doc.document, "info": doc.info, "indices": doc.indices[i : i + PAGES_PER_TASK]}
        for doc in todo
        for i in range(0, len(doc.indices), PAGES_PER_TASK)
    ]
    bar = progress.add_task("OCR", total=sum(len(doc.indices) for doc in todo))
    actors = ray.data.ActorPoolStrategy(size=options.actors, max_concurrent_calls_per_actor=calls)
    with _remote_args_allowed():
        pages = (
            ray.data.from_items(chunks, override_num_blocks=len(chunks))
            .flat_map(decode_row, fn_kwargs={"config": config}, max_retries=options.retries)
            .map_batches(
                OcrWorker,
                fn_constructor_kwargs={"config": config},
                batch_size=1,
                compute=actors,
                num_cpus=1,
                max_restarts=options.retries,
                max_task_retries=options.retries,
            )
        )
    try:
        for row in pages.iter_rows():
            progress.advance(bar)
            done = assembler.add(row)
            if done is not None:
                _write(folder, *done, options.fmt, record)
    except Exception as exc:  # the pipeline gave up after its retries: the rest is for a later run
        log.error("the OCR pipeline failed: %s", exc)
        problem = {"status": 500, "title": "Batch pipeline failed", "detail": f"{type(exc).__name__}: {exc}"}
        for entry in assembler.unfinished(problem):
            record(entry)


def _write(
    folder: OutputFolder, entry: ManifestEntry, result: dict, fmt: str, record: Callable[[ManifestEntry], None]
) -> None:
    """Write one assembled document (not a failed one) and record its entry."""
    if entry.status != "failed":
        try:
            folder.write(entry, result, fmt)
        except OSError as exc:
            problem = {"status": 507, "title": "Result not written", "detail": f"{exc.strerror or exc}: {entry.output}"}
            entry.status, entry.errors = "failed", [*entry.errors, {"page": None, **problem}]
    record(entry)


def _calls_per_actor(slots: int) -> int:
    """Pages an OCR actor works on at once: four times its engine's ``slots`` (the gateway keeps
    twice them in its engine). Each page's result goes back through Ray Data before the actor is
    sent the next one, so fewer leave the engine waiting between pages. Measured with one
    detection worker on two-thread sessions (2 slots) over the 72 corpus pages on 2 cores, runs
    one after the other: 2 pages at once 53.6 pages/min, 4 58.5, 8 65.8, 16 66.3; with
    :func:`_worker_config`'s engine (4 slots; one recognition thread then) over the 36 corpus
    images, alternating runs on a machine running half as fast: 16 at once 26.8 and 28.1
    pages/min, 8 27.7 and 27.8."""
    return 4 * slots


def _worker_config(config: Config) -> Config:
    """The profile an OCR actor builds its engine from: ``config`` with the embedded engine sized
    to the :data:`CPUS_PER_ACTOR` cores an actor is given: that many detection workers
    (``engine.onnx.det_workers``) and recognition runs at once (``rec_workers``), on one onnxruntime
    thread per stage session (``intra_op_num_threads`` and ``background_threads`` 1, so one set of
    sessions is built), at ``background_nice`` rather than SCHED_IDLE (``background_scheduling``):
    an actor's pages are all background, with no interactive page to yield to, and under SCHED_IDLE
    they would yield the cores to every decoding task as well. Single-threaded runs cost less CPU
    per page than two threads each (engine alone, 36 corpus images on 2 cores, 8 pages in flight,
    alternating runs: 3.39 CPU seconds a page against 3.58 with one detection worker on two-thread
    sessions, 31.7 and 31.8 pages/min). One recognition thread was the batch's bottleneck: sampled
    by py-spy over 60 s of a batch run on 2 cores, it was busy (running or waiting for a core) 99%
    of the time and the two detection workers 42% and 38%; the machine's CPU was 76% used. Two
    recognition threads keep it busy: over the 72 corpus pages of ``scripts/bench_batch.py``'s batch
    side, runs one after the other in one process, 38.4 pages/min (112.5 s) against 28.0 (154.3 s)
    with one."""
    onnx = config.engine.onnx.model_copy(
        update={
            "det_workers": CPUS_PER_ACTOR,
            "rec_workers": CPUS_PER_ACTOR,
            "intra_op_num_threads": 1,
            "background_threads": 1,
            "background_scheduling": "nice",
        }
    )
    return config.model_copy(update={"engine": config.engine.model_copy(update={"onnx": onnx})})


def _actors(requested: int, config: Config) -> int:
    """The OCR actors of the run: ``requested``, or :func:`_default_actors` for 0.

    Raises:
        ValueError: as many actors as the cluster has CPUs or more: each holds one, and the
            decoding tasks that feed them need one too (the run would wait for ever).
    """
    actors = requested or _default_actors(config)
    cpus = int(ray.cluster_resources().get("CPU", 1))
    if actors >= cpus:
        fix = f"use at most {cpus - 1}" if cpus > 1 else "the embedded engine needs a cluster of 2 CPUs or more"
        raise ValueError(
            f"--actors {actors} leaves none of the Ray cluster's {cpus} CPUs for decoding pages (each actor "
            f"holds one); {fix}"
        )
    return actors


def _default_actors(config: Config) -> int:
    """OCR actors when ``--actors`` is not given: one for an engine of replicas, else one per
    :data:`CPUS_PER_ACTOR` CPUs of the cluster (see :func:`_worker_config`)."""
    if config.engine.kind == "vllm":
        return 1
    return max(1, int(ray.cluster_resources().get("CPU", 1)) // CPUS_PER_ACTOR)


@contextlib.contextmanager
def _remote_args_allowed() -> Iterator[None]:
    """Pass Ray's own retry settings (``max_retries``, ``max_restarts``, ``max_task_retries``) to
    Ray Data: Ray 2.60 deprecates its ``**ray_remote_args`` for removal in 2.64 and names no
    replacement for these (the ``ray`` extra stops below 2.64), so its warning is silenced here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`ray_remote_args` is deprecated", RayDeprecationWarning)
        yield


@contextlib.contextmanager
def _progress(console: Console | None) -> Iterator[Progress]:
    """A Rich bar per execution (documents inspected, pages OCR'd), hidden without ``console``."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, disable=console is None) as progress:
        yield progress
