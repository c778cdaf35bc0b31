"""What a batch run (and ``ocrserve ocr --out``) leaves under ``--out``: results, their done
records, the manifest (batch only).

Layout::

    <out>/<name>.<suffix>                          one result per document (.json, .txt, .md, .jsonl)
    <out>/manifest.jsonl                           the last run: one JSON line per document
    <out>/.ocrserve-batch/done/<h[:2]>/<h>.json    the done record of a result (h: sha256 of its name)

A result is written to a temporary file beside it and renamed into place, then its done record
the same way, so a run killed at any moment leaves each result whole or absent; a result without
its record (killed between the two renames) is made again. A document is skipped when its done
record holds the same resume key (:func:`resume_key`) and its result is there as written (the
record holds the result's sha256: one damaged or edited since is made again).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TextIO

from ocrserve.client import file_sha256
from ocrserve.config import PreprocessConfig
from ocrserve.formats import render_markdown, render_text
from ocrserve.store.cache import dedup_key, normalization

#: The folder under ``--out`` holding the done records.
STATE_DIR = ".ocrserve-batch"
#: The manifest's file name under ``--out``.
MANIFEST = "manifest.jsonl"
#: The done record's field holding the sha256 of the result as written.
RESULT_SHA256 = "result_sha256"
#: Page problem statuses worth another run: the engine was down (503) or a deadline passed (504).
TRANSIENT_STATUSES = frozenset({503, 504})


def resume_key(sha256: str, indices: list[int], model: str, preprocess: PreprocessConfig) -> str:
    """The resume key of a document: the gateway's dedup-cache key (:func:`ocrserve.store.cache.dedup_key`)
    over its content hash, its selected pages (0-based), the model id and the pixel budget, so a
    result is reused exactly where the gateway would reuse it."""
    return dedup_key(sha256, indices, model, normalization(preprocess))


@dataclass
class ManifestEntry:
    """One document's line of the manifest.

    Attributes:
        document: the input file, as found.
        output: its result's path relative to ``--out`` (whether or not one was written).
        status: ``succeeded``, ``partial`` (some pages failed), ``failed`` (no result written:
            the document, or every page, failed) or ``skipped`` (done by an earlier run).
        pages: pages selected for OCR (0 when the document could not be inspected).
        errors: each failure: ``{"page": 1-based or None for the whole document, "status",
            "title", "detail"}``.
        seconds: its pages' ``preprocess_s`` plus ``engine_s`` (the engine's stage timings, waits
            inside the OCR actor's engine included); not wall time: pages overlap.
        engine: the model id that read it.
        key: its resume key ("" when it could not be read).
        ocr_pages: pages the engine read for it in this run (0 when skipped or failed before OCR).
        workers: the OCR workers (``host:pid``) that ran its pages in this run.
    """

    document: str
    output: str
    status: str
    pages: int = 0
    errors: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    engine: str = ""
    key: str = ""
    ocr_pages: int = 0
    workers: list[str] = field(default_factory=list)

    @property
    def final(self) -> bool:
        """Whether a later run may skip it: a result was written and no page failed for a
        transient reason (:data:`TRANSIENT_STATUSES`)."""
        return self.status in ("succeeded", "partial") and not any(
            e.get("status") in TRANSIENT_STATUSES for e in self.errors
        )

    def skipped(self, document: str) -> ManifestEntry:
        """This done entry as a later run reports it for ``document``: ``skipped``, no time, no OCR."""
        return replace(self, document=document, status="skipped", seconds=0.0, ocr_pages=0, workers=[])

    def to_json(self) -> str:
        """One compact JSON line (no newline)."""
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> ManifestEntry:
        """The entry of a :meth:`to_json` line.

        Raises:
            ValueError: not JSON; TypeError: not an entry's fields.
        """
        return cls(**json.loads(line))


def page_errors(pages: list[dict]) -> list[dict]:
    """The manifest's errors of a document's page dicts (``PageResult.to_dict()``): one per failed page."""
    return [{"page": p["index"] + 1, **_problem_fields(p["error"])} for p in pages if p.get("error")]


def document_error(problem: dict) -> list[dict]:
    """The manifest's errors of a document that failed as a whole with ``problem`` (RFC 9457 dict)."""
    return [{"page": None, **_problem_fields(problem)}]


def _problem_fields(problem: dict) -> dict:
    return {k: problem.get(k) for k in ("status", "title", "detail")}


def render(result: dict, fmt: str) -> str:
    """A result dict (DESIGN.md's result JSON) as ``fmt``: ``json`` (indented, as ``ocrserve ocr``
    writes it), ``text``, ``markdown`` (as ``POST /v1/ocr`` renders them) or ``jsonl`` (one page
    entry a line).

    Raises:
        ValueError: an unknown ``fmt``.
    """
    if fmt == "json":
        return json.dumps(result, ensure_ascii=False, indent=2)
    if fmt == "text":
        return render_text(result)
    if fmt == "markdown":
        return render_markdown(result)
    if fmt == "jsonl":
        return "".join(json.dumps(page, ensure_ascii=False) + "\n" for page in result["pages"])
    raise ValueError(f"unknown format {fmt!r}")


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file beside it, flushed to disk and
    renamed into place: a reader, or a later run, sees the old file or the new one, never part of one.

    Raises:
        OSError: the write failed (the temporary file is removed).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with tmp.open("w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class OutputFolder:
    """``--out``: results and their done records.

    Args:
        root: the folder (created if missing).
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _record_path(self, output: str) -> Path:
        digest = hashlib.sha256(output.encode()).hexdigest()
        return self.root / STATE_DIR / "done" / digest[:2] / f"{digest}.json"

    def done(self, output: str, key: str) -> ManifestEntry | None:
        """The entry that wrote ``output`` (a path relative to the folder) for resume key ``key``,
        or None: no record, another key (the file, its pages or the model changed), or the result
        is gone or not as written."""
        try:
            record = json.loads(self._record_path(output).read_text(encoding="utf-8"))
            written = record.pop(RESULT_SHA256)
            entry = ManifestEntry(**record)
        except (FileNotFoundError, ValueError, TypeError, KeyError, AttributeError):  # none, or not this version's
            return None
        if entry.key != key:
            return None
        try:
            return entry if file_sha256(self.root / output) == written else None
        except OSError:  # gone, or a folder now
            return None

    def write(self, entry: ManifestEntry, result: dict, fmt: str) -> None:
        """Write a document's result (rendered as ``fmt``) at ``entry.output``, then, when the entry
        is :attr:`~ManifestEntry.final`, its done record (the entry and the result's sha256); both atomically.

        Raises:
            OSError: a write failed.
        """
        self.write_text(entry, render(result, fmt))

    def write_text(self, entry: ManifestEntry, text: str) -> None:
        """:meth:`write` of a result already rendered as ``text``.

        Raises:
            OSError: a write failed.
        """
        write_atomic(self.root / entry.output, text)
        if entry.final:
            record = {**asdict(entry), RESULT_SHA256: hashlib.sha256(text.encode()).hexdigest()}
            write_atomic(self._record_path(entry.output), json.dumps(record, ensure_ascii=False))
        else:  # an earlier record would skip a result that still needs another try
            self._record_path(entry.output).unlink(missing_ok=True)


class Manifest:
    """``--out/manifest.jsonl`` of this run: one line per document, added as each one ends
    (written whole and flushed, so a killed run leaves the lines of the documents it finished).

    Args:
        path: the manifest file (replaced: it describes one run).
    """

    def __init__(self, path: Path):
        self.path = path
        self._fh: TextIO = path.open("w", encoding="utf-8")

    def add(self, entry: ManifestEntry) -> None:
        """Append ``entry``'s line."""
        self._fh.write(entry.to_json() + "\n")
        self._fh.flush()

    def close(self) -> None:
        """Close the file."""
        with contextlib.suppress(OSError):
            self._fh.close()
