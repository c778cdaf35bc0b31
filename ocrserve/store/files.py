"""The job data folder (``store.data_dir``): uploads, page results and dedup-cache entries on disk.

Layout (paths the store records are relative to the folder, so replicas may mount a shared volume
at different places)::

    staging/<random>                      uploads being received (moved into a job once accepted)
    jobs/<job id>/upload-<document>       the documents as sent
    jobs/<job id>/page-<seq>-<token>.json one page's result, written by the claim ``token``
    cache/<key[:2]>/<key>.json            dedup-cache entries: a document's page results

Every file is written to a temporary name and renamed into place, so a reader never sees half a
file, even when the writer is killed; a write that fails (a full disk) removes what it wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

#: Copy buffer for uploads, bytes.
CHUNK = 1 << 20


class DataDir:
    """Paths and atomic writes under ``store.data_dir``.

    Args:
        root: the folder (created if missing).
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        for sub in ("staging", "jobs", "cache"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def job_dir(self, job_id: str) -> Path:
        """The folder of one job's uploads and results."""
        return self.root / "jobs" / job_id

    def upload_path(self, job_id: str, document: int) -> Path:
        """Where document ``document`` (0-based) of a job is kept."""
        return self.job_dir(job_id) / f"upload-{document}"

    def stage(self, source: BinaryIO, hasher) -> tuple[Path, int]:
        """Copy an upload into ``staging/``, feeding ``hasher`` (a ``hashlib`` object) on the way.

        Returns:
            ``(path, bytes)``. Blocking: run it off the event loop.

        Raises:
            OSError: the copy failed (``ENOSPC`` when the disk is full); the partial file is removed.
        """
        path = self.root / "staging" / secrets.token_hex(16)
        size = 0
        with _removed_on_failure(path), path.open("wb") as out:
            while chunk := source.read(CHUNK):
                hasher.update(chunk)
                out.write(chunk)
                size += len(chunk)
        return path, size

    def adopt(self, job_id: str, staged: list[Path]) -> None:
        """Move staged uploads into a job's folder, in document order."""
        self.job_dir(job_id).mkdir(parents=True, exist_ok=True)
        for document, path in enumerate(staged):
            os.replace(path, self.upload_path(job_id, document))

    def write_page(self, job_id: str, seq: int, token: str, result: dict) -> str:
        """Save one page's result; returns its path relative to the folder."""
        relative = f"jobs/{job_id}/page-{seq:06d}-{token}.json"
        self.write_json(relative, result)
        return relative

    def cache_path(self, key: str) -> str:
        """The relative path of a dedup-cache entry."""
        return f"cache/{key[:2]}/{key}.json"

    def write_json(self, relative: str, data) -> None:
        """Write ``data`` as JSON at ``relative``, atomically.

        Raises:
            OSError: the write failed (``ENOSPC`` when the disk is full); nothing is left behind.
        """
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        with _removed_on_failure(tmp):
            tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
            os.replace(tmp, path)

    def probe(self) -> tuple[int, int]:
        """Write and delete a one-byte file in ``staging/``; returns the bytes free to unprivileged
        users and the size of the file system, bytes.

        Raises:
            OSError: the folder takes no file (``ENOSPC``/``EDQUOT`` when full, ``EROFS``, ``EIO``).
        """
        path = self.root / "staging" / f".probe-{secrets.token_hex(8)}"
        try:
            path.write_bytes(b"\0")
        finally:
            path.unlink(missing_ok=True)
        stats = os.statvfs(self.root)
        return stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize

    def read_json(self, relative: str):
        """The JSON at ``relative``.

        Raises:
            FileNotFoundError: no such file (a deleted job, an evicted cache entry).
        """
        return json.loads((self.root / relative).read_text(encoding="utf-8"))

    def remove(self, relative: str) -> None:
        """Delete one file if it exists."""
        (self.root / relative).unlink(missing_ok=True)

    def remove_job(self, job_id: str) -> None:
        """Delete a job's uploads and results."""
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    def sweep_staging(self, older_than_s: float) -> int:
        """Delete staged uploads older than ``older_than_s`` (left by requests that died); returns how many."""
        cutoff = time.time() - older_than_s
        removed = 0
        for path in (self.root / "staging").iterdir():
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                pass  # another gateway swept it first
        return removed


@contextlib.contextmanager
def _removed_on_failure(path: Path) -> Iterator[None]:
    """Delete ``path`` if the block raises, so that a failed write leaves no partial file."""
    try:
        yield
    except BaseException:
        path.unlink(missing_ok=True)
        raise
