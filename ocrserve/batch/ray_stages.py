"""The work of each stage of ``ocrserve batch``, free of Ray (:mod:`ocrserve.batch.ray_pipeline` runs it).

Each stage reuses the gateway's own pieces, so that a document read here gives the text
``POST /v1/ocr`` gives:

1. :func:`inspect_row`: hash the file, :func:`~ocrserve.preprocess.inspect_document` it and
   select its pages (``DocumentInfo.select``: the gateway's page and pixel limits), compute its
   resume key.
2. :func:`decode_row`: :func:`~ocrserve.preprocess.decode_pages` of a chunk of its pages (the
   pixel budget, EXIF, colour modes, PDF rendering); a page that cannot be decoded fails alone.
3. :class:`OcrWorker`: an engine from :func:`~ocrserve.engines.create_engine` per worker; pages
   run concurrently, timed and failed as the gateway's page pipeline does them.
4. :class:`Assembler`: pages back into documents (``formats.assemble_result``), each page once.

Rows are plain dicts of strings, numbers and bytes; documents are named by their input path
(``document``).
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ocrserve.batch.output_folder import ManifestEntry, document_error, page_errors, resume_key
from ocrserve.client import file_sha256
from ocrserve.config import Config
from ocrserve.engines import create_engine
from ocrserve.errors import ProblemError
from ocrserve.formats import assemble_result
from ocrserve.pages import Page, PageResult
from ocrserve.pipeline import attempt_page
from ocrserve.preprocess import DecodeFailure, DocumentInfo, decode_pages, inspect_document
from ocrserve.work import EngineClass

#: The ``lane`` of a batch result (DESIGN.md's result JSON: ``fast`` or ``bulk`` from the gateway).
LANE = "batch"


def inspect_row(row: dict, *, config: Config, model: str, pages: str | None) -> dict:
    """Stage 1 for one document (a Ray Data ``map`` function).

    Args:
        row: ``{"document": input path, "output": result path relative to out}``.
        config: the profile (its ``preprocess`` limits and pixel budget).
        model: the engine's model id (part of the resume key).
        pages: the ``--pages`` ranges (``"1-3,5"``), or None for all.

    Returns:
        ``row`` plus ``key`` (its resume key), ``indices`` (0-based pages selected), ``info`` (the
        pickle of its :class:`DocumentInfo`) and ``failed`` (the manifest entry of a document that
        cannot be read, decoded or is over a limit, as JSON; "" for the others). Never raises for
        the file's faults.
    """
    document, output = row["document"], row["output"]
    try:
        sha256 = file_sha256(Path(document))
        info = inspect_document(document, config.preprocess)
        indices = info.select(pages, config.preprocess)
    except (ProblemError, OSError) as exc:
        problem = exc.to_dict() if isinstance(exc, ProblemError) else _os_problem(exc)
        entry = ManifestEntry(document, output, "failed", errors=document_error(problem), engine=model)
        return {**row, "key": "", "indices": [], "info": b"", "failed": entry.to_json()}
    key = resume_key(sha256, indices, model, config.preprocess)
    return {**row, "key": key, "indices": indices, "info": pickle.dumps(info), "failed": ""}


def _os_problem(exc: OSError) -> dict:
    """The problem dict of a document that cannot be read (gone, no permission)."""
    return {"status": 400, "title": "Unreadable document", "detail": f"{exc.strerror or exc}: {exc.filename}"}


def decode_row(row: dict, *, config: Config) -> list[dict]:
    """Stage 2 for a chunk of one document's pages (a Ray Data ``flat_map`` function).

    Args:
        row: ``{"document": input path, "info": pickled DocumentInfo, "indices": 0-based pages}``.
        config: the profile (its ``preprocess`` limits and pixel budget).

    Returns:
        One row per page, in order: ``{"document", "page"}`` where ``page`` is the pickle of the
        normalized :class:`~ocrserve.pages.Page` or of its :class:`DecodeFailure` (the whole chunk
        fails with the document's problem when the file can no longer be opened): bytes, which
        Arrow holds as they are.
    """
    info: DocumentInfo = pickle.loads(row["info"])
    indices = [int(i) for i in row["indices"]]
    try:
        decoded = decode_pages(row["document"], info, indices, config.preprocess)
    except ProblemError as problem:
        decoded = [DecodeFailure(i, problem) for i in indices]
    return [{"document": row["document"], "page": pickle.dumps(page, protocol=5)} for page in decoded]


class OcrWorker:
    """Stage 3: Ray Data's callable class for the OCR actors; one engine per actor.

    Args:
        config: the profile; ``create_engine(config)`` builds the engine (the embedded ONNX engine,
            or the ``vllm`` engine's client of ``engine.vllm.base_urls``).

    Pages run as :attr:`~ocrserve.work.EngineClass.BACKGROUND` work (the bulk lane's class: the
    embedded engine runs them on its bulk sessions, sized by the run's ``pipeline._worker_config``).
    The engine starts on the first batch, on the event loop Ray Data runs this class's batches
    on, so that several batches of one actor share it (their pages batched together inside it).
    """

    def __init__(self, config: Config):
        self.engine = create_engine(config)
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self._starting: asyncio.Future | None = None

    async def __call__(self, batch: dict[str, np.ndarray]) -> AsyncIterator[dict[str, list]]:
        """OCR a batch of page rows (``{"document", "page"}``, as :func:`decode_row` makes them) concurrently.

        Yields:
            One batch: per page ``document``, ``page`` (its result entry as JSON: text, lines,
            timings, or ``error``), ``ocr`` (whether the engine read it: False for a page that
            failed decoding or in the engine, or was answered from its PDF text layer) and
            ``worker`` (``host:pid`` of this actor).

        Raises:
            Exception: the engine failed to start (the run then records the documents not done
                as failed).
        """
        if self._starting is None:
            self._starting = asyncio.ensure_future(self.engine.start())
        await asyncio.shield(self._starting)
        outcomes = await asyncio.gather(*(self._one(pickle.loads(page)) for page in batch["page"]))
        yield {
            "document": [str(d) for d in batch["document"]],
            "page": [json.dumps(result, ensure_ascii=False) for result, _ in outcomes],
            "ocr": [ran for _, ran in outcomes],
            "worker": [self.name] * len(outcomes),
        }

    async def _one(self, page: Page | DecodeFailure) -> tuple[dict, bool]:
        """One page's result entry (:func:`~ocrserve.pipeline.attempt_page`, as the gateway runs a
        page), and whether the engine read it."""

        async def read(page: Page) -> PageResult:
            return await self.engine.ocr_page(page, priority=EngineClass.BACKGROUND)

        attempt = await attempt_page(page, read, skipped=lambda: None)
        return attempt.result.to_dict(), attempt.problem is None and attempt.result.source == "ocr"


@dataclass
class _Pending:
    """A document whose pages are coming back."""

    entry: ManifestEntry
    indices: frozenset[int]
    pages: dict[int, dict] = field(default_factory=dict)
    workers: set[str] = field(default_factory=set)


class Assembler:
    """Stage 4, in the driver: collects page results into documents, each page once.

    Args:
        model: the engine's model id (the results' ``model``).
    """

    def __init__(self, model: str):
        self.model = model
        self._pending: dict[str, _Pending] = {}

    def expect(self, entry: ManifestEntry, indices: list[int]) -> None:
        """Wait for the pages ``indices`` of ``entry.document`` (``entry`` has its output and key)."""
        self._pending[entry.document] = _Pending(entry, frozenset(indices))

    def add(self, row: dict) -> tuple[ManifestEntry, dict] | None:
        """Take one page row of the OCR stage (``document``, ``page`` JSON, ``ocr``, ``worker``).

        Returns:
            ``(entry, result)`` when it was the document's last page: its manifest entry (status
            ``succeeded``, ``partial`` or ``failed``) and its result dict (``id`` = its resume key).
            None otherwise, and for a page already taken (a retried task's duplicate).
        """
        pending = self._pending.get(row["document"])
        page = json.loads(row["page"])
        if pending is None or page["index"] in pending.pages or page["index"] not in pending.indices:
            return None
        pending.pages[page["index"]] = page
        pending.entry.ocr_pages += bool(row["ocr"])
        pending.workers.add(row["worker"])
        if len(pending.pages) < len(pending.indices):
            return None
        del self._pending[row["document"]]
        return self._finish(pending)

    def _finish(self, pending: _Pending) -> tuple[ManifestEntry, dict]:
        pages = [pending.pages[i] for i in sorted(pending.pages)]
        seconds = sum(p["timings"].get("preprocess_s", 0.0) + p["timings"].get("engine_s", 0.0) for p in pages)
        errors = page_errors(pages)
        status = "failed" if len(errors) == len(pages) else "partial" if errors else "succeeded"
        entry = replace(
            pending.entry, status=status, errors=errors, seconds=round(seconds, 4), workers=sorted(pending.workers)
        )
        return entry, assemble_result(pages, self.model, LANE, seconds, result_id=entry.key)

    def unfinished(self, problem: dict) -> list[ManifestEntry]:
        """The entries of every document still missing pages, ``failed`` with ``problem`` (the run
        stopped before they were done); they are forgotten."""
        entries = [
            replace(p.entry, status="failed", errors=document_error(problem), workers=sorted(p.workers))
            for p in self._pending.values()
        ]
        self._pending.clear()
        return entries
