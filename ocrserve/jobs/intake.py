"""Accepting a job: keep the uploads, check them, answer from the dedup cache, store the job.

Everything that can refuse a job happens here, before the 202: parameters (400), the webhook
URL (400, see ``ocrserve.jobs.webhooks``), each document's type and limits (413/415, by
:meth:`~ocrserve.preprocess.Preprocessor.inspect`, which decodes no pixels) and an
``Idempotency-Key`` reused with another request (409) and the tenant's quota of queued pages
(429, ``jobs.max_queued_pages_per_tenant``). Uploads stream to ``staging/`` while they are hashed and
move into the job's folder once it is accepted. A job is refused at once while the storage fails
(503 or 507, see ``ocrserve.store.health``); a refused job leaves none of its files behind.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ocrserve import metrics
from ocrserve.config import Config
from ocrserve.errors import BadRequest
from ocrserve.jobs.webhooks import check_webhook_url
from ocrserve.logs import current_request_id
from ocrserve.preprocess import Preprocessor
from ocrserve.store.base import JobStore
from ocrserve.store.cache import DedupCache
from ocrserve.store.files import DataDir
from ocrserve.store.health import StoreHealth
from ocrserve.store.job_records import ANONYMOUS, Job, JobDocument, JobStatus, PageOutcome, PageState

#: Longest ``Idempotency-Key`` accepted, characters.
MAX_IDEMPOTENCY_KEY = 255


@dataclass
class Upload:
    """One document of a submission: the client's file name and a readable binary file."""

    name: str
    file: BinaryIO


@dataclass
class Submission:
    """The outcome of :meth:`Intake.submit`.

    Attributes:
        job: the job (new, or the earlier one of a replayed ``Idempotency-Key``).
        created: False for a replay.
        cached: True when every document came from the dedup cache (no engine work).
    """

    job: Job
    created: bool
    cached: bool


def parse_job_priority(raw: str | None, highest: int) -> int:
    """``priority`` of a job: an integer 0..``highest`` (default 0; higher runs first).

    Raises:
        BadRequest: anything else.
    """
    if raw in (None, ""):
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= highest:
        raise BadRequest(f"priority={raw!r}: expected an integer from 0 to {highest} (higher runs first)")
    return value


def check_idempotency_key(key: str) -> str:
    """The key as given. Raises BadRequest when longer than 255 characters or not printable ASCII."""
    if len(key) > MAX_IDEMPOTENCY_KEY or not all(" " <= c <= "~" for c in key):
        raise BadRequest(f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} printable ASCII characters")
    return key


class Intake:
    """Turns uploads and parameters into a stored job.

    Args:
        config: the profile (``jobs``, ``preprocess``).
        store, data, cache: where jobs, files and cached results live.
        preprocessor: inspects each document (page count, sizes, limits).
        model: the engine's model id, recorded with the job.
        on_submit: called after a new job is stored (wakes the local worker).
        health: the storage's state: a job is refused at once while the store fails (503) or the
            data folder is full (507), and a storage fault while it is taken becomes one of those.
    """

    def __init__(
        self,
        config: Config,
        store: JobStore,
        data: DataDir,
        cache: DedupCache,
        preprocessor: Preprocessor,
        model: str,
        on_submit: Callable[[], None],
        health: StoreHealth,
    ):
        self.config = config
        self.store = store
        self.data = data
        self.cache = cache
        self.preprocessor = preprocessor
        self.model = model
        self.on_submit = on_submit
        self.health = health

    async def submit(
        self,
        uploads: list[Upload],
        params: dict[str, str],
        idempotency_key: str = "",
        *,
        tenant: str = ANONYMOUS,
        max_queued_pages: int = 0,
    ) -> Submission:
        """Accept a job of ``uploads`` with ``params`` (``pages``, ``priority``, ``webhook_url``, and
        ``timeout``: seconds, already validated by the API; pages not done that long after the 202
        fail with 504) for ``tenant``, which owns it and its ``Idempotency-Key``.

        Args:
            max_queued_pages: refuse the job when its pages would take the tenant's queued and
                running ones above this; 0 = no quota.

        Raises:
            ProblemError: 400 (no file, bad parameter, refused webhook), 413/415 (a document),
                409 (``IdempotencyConflict``), 429 (the quota), 503 with ``Retry-After`` (the job
                store fails), 507 (the data folder is full); a refused job leaves no file behind.
        """
        cfg = self.config.jobs
        if not uploads:
            raise BadRequest("send at least one multipart field 'file'")
        priority = parse_job_priority(params.get("priority"), cfg.max_priority)
        webhook_url = params.get("webhook_url") or ""
        if webhook_url:
            await check_webhook_url(webhook_url, cfg)
        self.health.require_writable()
        staged: list[Path] = []
        try:
            documents = [await self._document(upload, params.get("pages"), staged) for upload in uploads]
            terms = {
                "pages": params.get("pages") or "",
                "priority": priority,
                "webhook_url": webhook_url,
                "timeout": float(params.get("timeout") or 0),
            }
            key = check_idempotency_key(idempotency_key) if idempotency_key else ""
            with self.health.guard():
                return await self._store(documents, staged, terms, key, tenant, max_queued_pages)
        finally:
            for path in staged:
                path.unlink(missing_ok=True)  # adopted ones have moved already

    async def _document(self, upload: Upload, pages: str | None, staged: list[Path]) -> JobDocument:
        """Stage, hash and inspect one upload."""
        hasher = hashlib.sha256()
        with self.health.guard():
            path, size = await asyncio.to_thread(self.data.stage, upload.file, hasher)
        staged.append(path)
        info = await self.preprocessor.inspect(path, self.config.router.bulk.priority)
        indices = info.select(pages, self.config.preprocess)
        sha256 = hasher.hexdigest()
        return JobDocument.from_info(upload.name, sha256, size, info, indices, self.cache.key(sha256, indices))

    async def _store(
        self, documents: list[JobDocument], staged: list[Path], terms: dict, key: str, tenant: str, quota: int
    ) -> Submission:
        """Store the job; ``terms`` holds its ``pages``, ``priority``, ``webhook_url`` and ``timeout``
        (0 = none), which with the documents make the request an ``Idempotency-Key`` stands for."""
        request = json.dumps({"documents": [[d.name, d.sha256] for d in documents], **terms}, sort_keys=True)
        created = time.time()
        job = Job(
            id=uuid.uuid4().hex,
            status=JobStatus.QUEUED,
            priority=terms["priority"],
            created=created,
            documents=documents,
            model=self.model,
            webhook_url=terms["webhook_url"],
            request_hash=hashlib.sha256(request.encode()).hexdigest(),
            deadline=created + terms["timeout"] if terms["timeout"] else 0.0,
            tenant=tenant,
            request_id=current_request_id(),
        )
        try:
            self.data.adopt(job.id, staged)
            finished = await self._from_cache(job)
            stored, created = await self.store.create(job, key, finished, quota)
        except BaseException:
            self.data.remove_job(job.id)
            raise
        if not created:
            self.data.remove_job(job.id)
            metrics.JOBS_SUBMITTED.labels("replay").inc()
            return Submission(stored, False, False)
        metrics.JOBS_SUBMITTED.labels("new").inc()
        if stored.terminal:
            metrics.JOBS_FINISHED.labels(stored.status).inc()
        else:
            self.on_submit()
        return Submission(stored, True, all(d.cached for d in stored.documents))

    async def _from_cache(self, job: Job) -> dict[int, PageOutcome]:
        """Outcomes of the pages whose documents the dedup cache holds, by ``seq``, copied into the
        job's folder (the cache may evict them later)."""
        finished: dict[int, PageOutcome] = {}
        seq = 0
        for document in job.documents:
            cached = await self.cache.get(document.cache_key) if document.cache_key else None
            document.cached = cached is not None
            for n in range(len(document.indices)):
                if cached is not None:
                    path = await asyncio.to_thread(self.data.write_page, job.id, seq, "cache", cached[n])
                    finished[seq] = PageOutcome(PageState.DONE, path)
                seq += 1
        return finished
