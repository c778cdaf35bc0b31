"""The job system of one gateway, wired together: store, data folder, their health, dedup cache,
intake, worker, webhook sender and janitor, started and stopped with the app (``ocrserve.api.app``)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from ocrserve import metrics
from ocrserve.config import Config
from ocrserve.jobs.intake import Intake
from ocrserve.jobs.janitor import Janitor
from ocrserve.jobs.webhooks import WebhookSender
from ocrserve.jobs.worker import Worker
from ocrserve.preprocess import Preprocessor
from ocrserve.router import Router
from ocrserve.store import open_store
from ocrserve.store.cache import DedupCache
from ocrserve.store.files import DataDir
from ocrserve.store.health import StoreHealth
from ocrserve.store.job_records import Job, JobStatus, PageRecord, PageState

log = logging.getLogger(__name__)


class Jobs:
    """Everything durable jobs need in one gateway.

    Args:
        config: the profile (``store``, ``jobs``, ``preprocess``).
        preprocessor, router: the app's own.

    Raises:
        OSError: ``store.data_dir`` cannot be created.
        ValueError: a ``store.url`` of unknown form.
    """

    def __init__(self, config: Config, preprocessor: Preprocessor, router: Router):
        self.config = config
        self.store = open_store(config.store)
        self.data = DataDir(config.store.data_dir)
        self.health = StoreHealth(self.store, self.data, config.store)
        self.cache = DedupCache(
            self.store, self.data, config.store.cache_entries, router.engine.model, config.preprocess
        )
        self.webhooks = WebhookSender(self.store, config.jobs)
        self.worker = Worker(
            self.store,
            self.data,
            self.health,
            preprocessor,
            router,
            config.jobs,
            owner=f"{socket.gethostname()}/{os.getpid()}",
            on_end=self._ended,
        )
        self.janitor = Janitor(self.store, self.data, config.jobs)
        self.intake = Intake(
            config,
            self.store,
            self.data,
            self.cache,
            preprocessor,
            router.engine.model,
            on_submit=self.worker.wake,
            health=self.health,
        )
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        """Start the storage probe, the worker, the webhook sender and the janitor on the running loop."""
        self._tasks = [
            asyncio.create_task(coro, name=f"ocrserve-jobs-{name}")
            for name, coro in (
                ("health", self.health.run()),
                ("worker", self.worker.run()),
                ("webhooks", self.webhooks.run(self.health)),
                ("janitor", self.janitor.run(self.health)),
            )
        ]
        for task in self._tasks:
            task.add_done_callback(_log_crash)

    async def close(self) -> None:
        """Stop them (pages held go back to the queue) and close the store."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.store.close()

    async def cancel(self, job_id: str) -> Job | None:
        """Cancel a job everywhere: in the store, and this worker's pages of it at once (other
        gateways drop theirs at their next heartbeat)."""
        job = await self.store.cancel(job_id)
        self.worker.drop_job(job_id)
        if job is not None and job.status == JobStatus.CANCELLED:
            metrics.JOBS_FINISHED.labels(JobStatus.CANCELLED).inc()
            self.webhooks.wake()
        return job

    async def _ended(self, job_id: str, status: str) -> None:
        """A page finished here ended its job: count it, cache its whole documents, send its webhook."""
        metrics.JOBS_FINISHED.labels(status).inc()
        self.webhooks.wake()
        try:
            await self._cache_documents(job_id)
        except Exception:
            log.warning("job %s: results not cached", job_id, exc_info=True)

    def _read_results(self, records: list[PageRecord]) -> list[dict]:
        """The stored page results of ``records`` (blocking file reads)."""
        return [self.data.read_json(r.result_path) for r in records]

    async def _cache_documents(self, job_id: str) -> None:
        job = await self.store.get(job_id)
        if job is None or not self.cache.enabled:
            return
        records = await self.store.pages(job_id)
        for number, document in enumerate(job.documents):
            mine = [r for r in records if r.document == number]
            if all(r.state == PageState.DONE for r in mine):
                pages = await asyncio.to_thread(self._read_results, mine)
                await self.cache.put(document.cache_key, pages)


def _log_crash(task: asyncio.Task) -> None:
    """A loop that should run until shutdown ended by itself: say so loudly."""
    if not task.cancelled() and task.exception():
        log.error("%s stopped", task.get_name(), exc_info=task.exception())
