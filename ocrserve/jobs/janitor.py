"""Retention: jobs that ended more than ``jobs.retention_s`` ago are deleted with their files.

Every gateway runs a janitor every ``jobs.janitor_interval_s``; deleting is idempotent, so
replicas sharing a store may sweep at the same time. Files go first, then the store's record, so
a job is never listed without its files being on their way out. Uploads staged by requests that
died before their job was stored are removed after a day (a request that fails removes its own
at once). While the gateway's :class:`~ocrserve.store.health.StoreHealth` says the store fails, the
janitor waits; its faults are reported there rather than logged each sweep.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ocrserve import metrics
from ocrserve.config import JobsConfig
from ocrserve.store.base import JobStore
from ocrserve.store.files import DataDir
from ocrserve.store.health import StoreHealth

log = logging.getLogger(__name__)
#: Staged uploads older than this, seconds, belong to requests that died.
STAGING_MAX_AGE_S = 86400.0
#: Jobs deleted per store query.
BATCH = 100


class Janitor:
    """Deletes expired jobs and stale staged uploads.

    Args:
        store, data: the job store and data folder.
        cfg: the ``jobs`` section (``retention_s``, ``janitor_interval_s``).
    """

    def __init__(self, store: JobStore, data: DataDir, cfg: JobsConfig):
        self.store = store
        self.data = data
        self.cfg = cfg

    async def sweep(self) -> int:
        """Delete every job that ended before ``now - retention_s``; returns how many."""
        deleted = 0
        while expired := await self.store.expired(time.time() - self.cfg.retention_s, BATCH):
            for job_id in expired:
                await asyncio.to_thread(self.data.remove_job, job_id)
                await self.store.delete(job_id)
            deleted += len(expired)
            metrics.JOBS_EXPIRED.inc(len(expired))
        await asyncio.to_thread(self.data.sweep_staging, STAGING_MAX_AGE_S)
        return deleted

    async def run(self, health: StoreHealth) -> None:
        """Sweep now and every ``janitor_interval_s`` until cancelled, each time once ``health``
        says the store works (a full data folder does not stop it: sweeping frees space)."""
        while True:
            await health.wait_store()
            try:
                if deleted := await self.sweep():
                    log.info("retention: deleted %d job(s) older than %g s", deleted, self.cfg.retention_s)
            except Exception as exc:
                if not health.report(exc):
                    log.warning("retention sweep failed", exc_info=True)
            await asyncio.sleep(self.cfg.janitor_interval_s)
