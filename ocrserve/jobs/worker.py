"""The job worker of one gateway: claims pages from the store and runs them through the router.

One claim loop and one heartbeat loop per gateway:

- **claim**: while this worker holds fewer than ``jobs.concurrency`` pages, it first reserves room
  in the router's bulk lane (``router.admit("bulk", 1)``; when the lane is full it waits
  ``jobs.poll_interval_s`` and tries again; a page is never failed for that), then claims one page
  (higher-priority jobs first). The page is decoded from the stored upload by the app's
  :class:`~ocrserve.preprocess.Preprocessor` and run by the same
  :class:`~ocrserve.pipeline.PagePipeline` as synchronous pages, under a
  :class:`~ocrserve.work.WorkItem` carrying the job's priority (:meth:`~ocrserve.work.Priority.of_job`:
  it orders the page in the bulk lane and in the engine) and its deadline; its result is written to
  the data folder and the page completed in the store.
- **heartbeat**: every third of ``jobs.lease_s`` it renews the leases of the pages it holds; a
  page it has lost (cancelled, or re-claimed by another gateway after a stall) is abandoned, which
  drops it from the router's queue, or aborts it in the engine.

Failures: a transient one (``PageError.transient``, the engine unavailable, the lane's default
deadline passed, an unexpected exception) sends the page back to the queue after
``retry_backoff_s * 2**(attempts-1)`` (at most ``retry_backoff_max_s``) until ``jobs.max_attempts``
claims; then, or at once for a permanent failure (an undecodable or too-large page, the job's own
deadline passed), the page fails. Claims cut short by a crash count as attempts too, so a page that kills its gateway
cannot do so forever. An unexpected exception (the decoding processes gone, an engine bug) also
pauses this worker's claims, doubling while it recurs, so a broken gateway does not spend the
attempts of every page in a shared store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ocrserve import backoff, metrics
from ocrserve.alarm import Alarm
from ocrserve.config import JobsConfig
from ocrserve.errors import DeadlinePassed, EngineFailed, Overloaded, Problem
from ocrserve.pages import Page
from ocrserve.pipeline import Attempt, PagePipeline
from ocrserve.preprocess import DecodeFailure, Preprocessor
from ocrserve.router import BULK, Reservation, Router
from ocrserve.store.base import JobStore
from ocrserve.store.files import DataDir
from ocrserve.store.records import Claim, Document, Job, Outcome, PageState
from ocrserve.work import Deadline, Priority, WorkItem

log = logging.getLogger(__name__)
#: Seconds between checks that the engine is ready again, before a claim.
READY_POLL_S = 0.2


def retry_delay(attempts: int, cfg: JobsConfig) -> float:
    """Seconds a page waits before its next try after ``attempts`` claims (exponential, capped)."""
    return backoff.delay(attempts, cfg.retry_backoff_s, cfg.retry_backoff_max_s)


class Worker:
    """Runs job pages in this gateway (see the module docstring).

    Args:
        store, data: the job store and data folder.
        preprocessor, router: the app's own, shared with synchronous requests.
        cfg: the ``jobs`` section.
        owner: this worker's name in the store (host, process).
        on_end: awaited with ``(job_id, status)`` when a completion here ends a job.
    """

    def __init__(
        self,
        store: JobStore,
        data: DataDir,
        preprocessor: Preprocessor,
        router: Router,
        cfg: JobsConfig,
        owner: str,
        on_end: Callable[[str, str], Awaitable[None]],
    ):
        self.store = store
        self.data = data
        self.preprocessor = preprocessor
        self.router = router
        self.pipeline = PagePipeline(router)
        self.cfg = cfg
        self.owner = owner
        self.on_end = on_end
        self.concurrency = cfg.concurrency or 2 * router.capacity
        self._room = asyncio.Semaphore(self.concurrency)
        self._active: dict[asyncio.Task, Claim] = {}
        self._alarm = Alarm()
        self._failures = 0  # unexpected failures in a row; 0 once a page gets through
        self._paused_until = 0.0  # time.monotonic() instant before which nothing is claimed

    def wake(self) -> None:
        """Work was submitted here: claim now rather than at the next poll."""
        self._alarm.ring()

    def _pause(self) -> None:
        """Stop claiming for a while after an unexpected failure (``retry_backoff_s``, doubling up to
        ``retry_backoff_max_s``), so that a broken gateway spends few pages' attempts."""
        self._failures += 1
        self._paused_until = time.monotonic() + retry_delay(self._failures, self.cfg)

    def drop_job(self, job_id: str) -> None:
        """Abandon this worker's pages of a cancelled job: queued ones never reach the engine, running
        ones are aborted there."""
        for task, claim in list(self._active.items()):
            if claim.job_id == job_id:
                task.cancel()

    async def run(self) -> None:
        """Claim and run pages until cancelled; then give back the pages not finished."""
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            while True:
                await self._room.acquire()
                try:
                    claim, reservation, admission = await self._next_page()
                except BaseException:
                    self._room.release()
                    raise
                task = asyncio.create_task(self._run(claim, reservation, admission))
                self._active[task] = claim
                metrics.JOB_PAGES_IN_FLIGHT.set(len(self._active))
                task.add_done_callback(self._finished)
        finally:
            heartbeat.cancel()
            for task in list(self._active):
                task.cancel()
            await asyncio.gather(heartbeat, *self._active, return_exceptions=True)

    async def _next_page(self) -> tuple[Claim, Reservation, contextlib.AsyncExitStack]:
        """Wait for a ready engine (pages are not spent on one known to be down or loading), for
        room in the bulk lane, then for a page to claim."""
        while True:
            if (paused := self._paused_until - time.monotonic()) > 0:
                await asyncio.sleep(paused)
            while not self.router.engine.ready:
                await asyncio.sleep(READY_POLL_S)
            admission = contextlib.AsyncExitStack()
            try:
                reservation = await admission.enter_async_context(self.router.admit(BULK, 1))
            except Overloaded:
                metrics.JOB_ADMISSION_WAITS.inc()
                await asyncio.sleep(self.cfg.poll_interval_s)
                continue
            try:
                claimed = await self.store.claim(self.owner, 1, self.cfg.lease_s)
            except Exception:
                log.warning("cannot claim pages from the job store", exc_info=True)
                claimed = []
            except BaseException:
                await admission.aclose()
                raise
            if claimed:
                metrics.JOB_CLAIMS.labels("first" if claimed[0].attempts == 1 else "again").inc()
                return claimed[0], reservation, admission
            await admission.aclose()
            await self._alarm.sleep(self.cfg.poll_interval_s)

    def _finished(self, task: asyncio.Task) -> None:
        self._active.pop(task, None)
        self._room.release()
        metrics.JOB_PAGES_IN_FLIGHT.set(len(self._active))
        if not task.cancelled() and task.exception():
            log.error("job page crashed", exc_info=task.exception())

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.lease_s / 3)
            held = dict(self._active)
            try:
                lost = await self.store.renew(list(held.values()), self.cfg.lease_s)
                metrics.JOB_BACKLOG.set(await self.store.backlog())
            except Exception:
                log.warning("cannot renew leases in the job store", exc_info=True)
                continue
            for task, claim in held.items():
                if claim in lost:
                    task.cancel()

    async def _run(self, claim: Claim, reservation: Reservation, admission: contextlib.AsyncExitStack) -> None:
        """One page, from claim to completion; gives the claim back if cancelled before the end."""
        async with admission:
            try:
                await self._work(claim, reservation)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await self.store.release(claim)  # no-op when the claim was lost or cancelled
                raise

    async def _work(self, claim: Claim, reservation: Reservation) -> None:
        job = await self.store.get(claim.job_id)
        if job is None or job.terminal:
            return  # cancelled (or deleted) after the claim
        attempt = await self._try(claim, job, reservation)
        if attempt.problem is not None and attempt.transient and claim.attempts < self.cfg.max_attempts:
            if await self.store.retry_later(claim, retry_delay(claim.attempts, self.cfg)):
                metrics.JOB_PAGES.labels("retried").inc()
            return
        await self._complete(claim, attempt)

    def work_item(self, job: Job) -> WorkItem:
        """The scheduling terms of ``job``'s pages: the bulk lane, the job's priority mapped to the
        engine's convention (:meth:`Priority.of_job`), and its deadline if it has one."""
        priority = Priority.of_job(job.priority, self.cfg.max_priority, self.router.cfg.bulk.priority)
        return WorkItem(deadline=Deadline.at_unix(job.deadline) if job.deadline else None, priority=priority, lane=BULK)

    async def _try(self, claim: Claim, job: Job, reservation: Reservation) -> Attempt:
        """:meth:`_attempt`, unless the page has had its tries; an unexpected failure is transient
        and pauses claims."""
        if claim.attempts > self.cfg.max_attempts:  # earlier claims died with their gateway
            problem = EngineFailed(
                f"page {claim.index + 1}: given up after {claim.attempts - 1} claims that never finished"
            )
            return Attempt.failed(claim.index, problem)
        try:
            attempt = await self._attempt(claim, job, reservation)
        except Exception as exc:  # this gateway misbehaves (decoding processes gone, an engine bug)
            log.exception("job %s page %d: unexpected failure; pausing claims", claim.job_id, claim.seq)
            self._pause()
            problem = EngineFailed(f"page {claim.index + 1}: {type(exc).__name__}: {exc}")
            return Attempt.failed(claim.index, problem, transient=True)
        self._failures = 0
        return attempt

    async def _complete(self, claim: Claim, attempt: Attempt) -> None:
        """Save the page's result and finish it in the store, unless someone else already has."""
        if attempt.problem is None:
            path = await asyncio.to_thread(
                self.data.write_page, claim.job_id, claim.seq, claim.token, attempt.result.to_dict()
            )
            outcome = Outcome(PageState.DONE, path)
        else:
            outcome = Outcome(PageState.FAILED, error=attempt.problem.to_dict() | {"attempts": claim.attempts})
        completion = await self.store.complete(claim, outcome)
        if not completion.counted:
            metrics.JOB_PAGES.labels("duplicate").inc()
            if outcome.result_path:
                await asyncio.to_thread(self.data.remove, outcome.result_path)
            return
        metrics.JOB_PAGES.labels(outcome.state).inc()
        self.pipeline.count_final(attempt)
        if completion.ended:
            await self.on_end(claim.job_id, completion.ended)

    async def _attempt(self, claim: Claim, job: Job, reservation: Reservation) -> Attempt:
        """Decode and OCR one page through the page pipeline.

        Raises:
            Exception: anything but a page's own failure (a broken decoding pool, an engine bug).
        """
        work = self.work_item(job)
        if work.deadline is not None and work.deadline.passed():
            problem = DeadlinePassed(f"page {claim.index + 1}: the job's deadline passed before it ran")
            reservation.release(1)
            return Attempt.failed(claim.index, problem)
        source = self.data.upload_path(claim.job_id, claim.document)
        try:
            page = await self._decode(source, job.documents[claim.document], claim.index)
        except Problem as problem:
            reservation.release(1)
            return Attempt.failed(claim.index, problem)
        return await self.pipeline.run(page, reservation, work)

    async def _decode(self, source: Path, document: Document, index: int) -> Page | DecodeFailure:
        """The page ``index`` of a stored upload, or its :class:`DecodeFailure`.

        Raises:
            Problem: the document itself cannot be opened any more (415).
        """
        chunks = self.preprocessor.pages(source, document.info(), [index])
        async with contextlib.aclosing(chunks):
            (page,) = await anext(chunks)
        return page
