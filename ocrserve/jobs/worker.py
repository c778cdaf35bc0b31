"""The job worker of one gateway: claims pages from the store and runs them through the router.

One claim loop and one heartbeat loop per gateway:

- **claim**: while this worker holds fewer than ``jobs.concurrency`` pages, it first reserves room
  in the router's bulk lane (:meth:`~ocrserve.router.Router.admit`; when the lane is full it waits
  ``jobs.poll_interval_s`` and tries again; a page is never failed for that), then claims one page
  (higher-priority jobs first). The page is decoded from the stored upload by the app's
  :class:`~ocrserve.preprocess.Preprocessor` and run by the same
  :class:`~ocrserve.pipeline.PagePipeline` as synchronous pages, under a
  :class:`~ocrserve.work.WorkItem` carrying the job's priority (:meth:`~ocrserve.work.Priority.of_job`:
  it orders the page in the bulk lane) and its deadline, resolved into the page's
  :class:`~ocrserve.scheduling.Terms` like any request's; its result is written to
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

Logs: while a page runs, its job's request id (the ``X-Request-ID`` of the request that created it)
is the current one (:mod:`ocrserve.logs`), so every line about the page carries it. Pages claimed
again because their lease lapsed (their gateway crashed or stalled) are reported by one WARNING a
job, naming it, the pages and that request id, :data:`LAPSED_LOG_S` after the first of them.

Storage faults (see :mod:`ocrserve.store.health`) are reported to the gateway's
:class:`~ocrserve.store.health.StoreHealth`, not logged per call, and claims wait while it says the
store fails or the data folder is full. A page whose result the full folder cannot take goes back
to the queue, its try not counted. A completion the failing store did not take is kept, result
file and all, and recorded once the store works again: it counts then unless the page was finished
meanwhile, and a result file that no completion counted is deleted (unless the store holds it: an
earlier try whose answer was lost), so no result is done twice or left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from ocrserve import backoff, metrics
from ocrserve.alarm import Alarm
from ocrserve.config import JobsConfig
from ocrserve.errors import DeadlinePassed, EngineFailed, Overloaded, ProblemError
from ocrserve.logs import set_request_id
from ocrserve.pages import Page
from ocrserve.pipeline import Attempt, PagePipeline
from ocrserve.preprocess import DecodeFailure, Preprocessor
from ocrserve.router import Reservation, Router
from ocrserve.scheduling import BULK, Terms, resolve
from ocrserve.store.base import JobStore
from ocrserve.store.files import DataDir
from ocrserve.store.health import StoreHealth
from ocrserve.store.job_records import Claim, Completion, Job, JobDocument, PageOutcome, PageState
from ocrserve.work import Deadline, Priority, WorkItem

log = logging.getLogger(__name__)
#: Seconds between checks that the engine is ready again, before a claim.
READY_POLL_S = 0.2
#: Seconds from the first page of a job claimed again after a lapsed lease to the warning that
#: counts them: the others, claimed in the same burst, are counted in the same line.
LAPSED_LOG_S = 2.0


@dataclass
class _Lapsed:
    """Pages of one job claimed again after their lease lapsed, not yet reported."""

    request_id: str
    pages: set[int] = field(default_factory=set)
    owners: set[str] = field(default_factory=set)
    handle: asyncio.TimerHandle | None = None


def retry_delay(attempts: int, cfg: JobsConfig) -> float:
    """Seconds a page waits before its next try after ``attempts`` claims (exponential, capped)."""
    return backoff.delay(attempts, cfg.retry_backoff_s, cfg.retry_backoff_max_s)


class Worker:
    """Runs job pages in this gateway (see the module docstring).

    Args:
        store, data: the job store and data folder.
        health: their state, consulted before claims and told of their faults.
        preprocessor, router: the app's own, shared with synchronous requests.
        cfg: the ``jobs`` section.
        owner: this worker's name in the store (host, process).
        on_end: awaited with ``(job_id, status)`` when a completion here ends a job.
    """

    def __init__(
        self,
        store: JobStore,
        data: DataDir,
        health: StoreHealth,
        preprocessor: Preprocessor,
        router: Router,
        cfg: JobsConfig,
        owner: str,
        on_end: Callable[[str, str], Awaitable[None]],
    ):
        self.store = store
        self.data = data
        self.health = health
        self.preprocessor = preprocessor
        self.router = router
        self.pipeline = PagePipeline(router, preprocessor)
        self.cfg = cfg
        self.owner = owner
        self.on_end = on_end
        self.concurrency = cfg.concurrency or 2 * router.capacity
        self._room = asyncio.Semaphore(self.concurrency)
        self._active: dict[asyncio.Task, Claim] = {}
        self._alarm = Alarm()
        self._failures = 0  # unexpected failures in a row; 0 once a page gets through
        self._paused_until = 0.0  # time.monotonic() instant before which nothing is claimed
        self._unrecorded: list[tuple[Claim, Attempt, PageOutcome]] = []  # completions the store did not take
        self._lapsed: dict[str, _Lapsed] = {}  # by job id: pages claimed again, to report

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
            for job_id in list(self._lapsed):
                self._report_lapsed(job_id)

    async def _next_page(self) -> tuple[Claim, Reservation, contextlib.AsyncExitStack]:
        """Wait for working storage (then record what it did not take before), for a ready engine
        (pages are not spent on one known to be down or loading), for room in the bulk lane, then
        for a page to claim."""
        while True:
            if (paused := self._paused_until - time.monotonic()) > 0:
                await asyncio.sleep(paused)
            await self.health.wait_writable()
            await self._settle()
            while not self.router.engine.ready:
                await asyncio.sleep(READY_POLL_S)
            admission = contextlib.AsyncExitStack()
            try:
                # room for a page not claimed yet: no deadline (its job's terms come with the claim)
                room = dataclasses.replace(resolve(WorkItem(lane=BULK), self.router.cfg, 1), deadline=None)
                reservation = await admission.enter_async_context(self.router.admit(room, 1))
            except Overloaded:
                metrics.JOB_ADMISSION_WAITS.inc()
                await asyncio.sleep(self.cfg.poll_interval_s)
                continue
            try:
                claimed = await self.store.claim(self.owner, 1, self.cfg.lease_s)
            except Exception as exc:
                if not self.health.report(exc):
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
            except Exception as exc:
                if not self.health.report(exc):
                    log.warning("cannot renew leases in the job store", exc_info=True)
                continue
            for task, claim in held.items():
                if claim in lost:
                    task.cancel()

    async def _run(self, claim: Claim, reservation: Reservation, admission: contextlib.AsyncExitStack) -> None:
        """One page, from claim to completion; gives the claim back if cancelled before the end. A
        storage fault on the way is reported; the claim then lapses and the page runs again."""
        async with admission:
            try:
                await self._work(claim, reservation)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await self.store.release(claim)  # no-op when the claim was lost or cancelled
                raise
            except Exception as exc:
                if not self.health.report(exc):
                    raise

    async def _work(self, claim: Claim, reservation: Reservation) -> None:
        job = await self.store.get(claim.job_id)
        if job is None or job.terminal:
            return  # cancelled (or deleted) after the claim
        set_request_id(job.request_id)  # this task's log lines are about the job's request
        if claim.lapsed_from:
            self._note_lapsed(claim, job)
        attempt = await self._try(claim, job, reservation)
        if attempt.problem is not None and attempt.transient and claim.attempts < self.cfg.max_attempts:
            if await self.store.retry_later(claim, retry_delay(claim.attempts, self.cfg)):
                metrics.JOB_PAGES.labels("retried").inc()
            return
        await self._complete(claim, attempt)

    def _note_lapsed(self, claim: Claim, job: Job) -> None:
        """Count a page claimed again after its lease lapsed, for the job's warning
        (:meth:`_report_lapsed`, :data:`LAPSED_LOG_S` after the first)."""
        lapsed = self._lapsed.get(job.id)
        if lapsed is None:
            lapsed = self._lapsed[job.id] = _Lapsed(job.request_id)
            lapsed.handle = asyncio.get_running_loop().call_later(LAPSED_LOG_S, self._report_lapsed, job.id)
        lapsed.pages.add(claim.seq)
        lapsed.owners.add(claim.lapsed_from)

    def _report_lapsed(self, job_id: str) -> None:
        """One WARNING for the pages of ``job_id`` claimed again since the last one."""
        lapsed = self._lapsed.pop(job_id, None)
        if lapsed is None:
            return
        if lapsed.handle is not None:
            lapsed.handle.cancel()
        pages = sorted(lapsed.pages)
        log.warning(
            "job %s: %d page(s) claimed again after their lease lapsed (held by %s, which crashed or stalled): "
            "page(s) %s",
            job_id,
            len(pages),
            ", ".join(sorted(lapsed.owners)),
            ", ".join(str(seq + 1) for seq in pages),
            extra={"request_id": lapsed.request_id, "job_id": job_id, "pages": len(pages)},
        )

    def terms(self, job: Job) -> Terms:
        """The scheduling terms of ``job``'s pages: the bulk lane, the job's priority mapped to the
        queue's convention (:meth:`Priority.of_job`), and its deadline if it has one."""
        priority = Priority.of_job(job.priority, self.cfg.max_priority, self.router.cfg.bulk.priority)
        deadline = Deadline.at_unix(job.deadline) if job.deadline else None
        return resolve(WorkItem(deadline=deadline, priority=priority, lane=BULK), self.router.cfg, 1)

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
        """Save the page's result and finish it in the store (:meth:`_record`). A result the data
        folder cannot take (full, broken) sends the page back to the queue, this try not counted."""
        try:
            outcome = await self._outcome(claim, attempt)
        except Exception as exc:
            if not self.health.report(exc):
                raise
            with contextlib.suppress(Exception):
                await self.store.release(claim)  # else its lease lapses
            return
        await self._record(claim, attempt, outcome)

    async def _outcome(self, claim: Claim, attempt: Attempt) -> PageOutcome:
        """The page's outcome, its result written to the data folder.

        Raises:
            OSError: the result could not be written (nothing of it is left).
        """
        if attempt.problem is not None:
            return PageOutcome(PageState.FAILED, error=attempt.problem.to_dict() | {"attempts": claim.attempts})
        path = await asyncio.to_thread(
            self.data.write_page, claim.job_id, claim.seq, claim.token, attempt.result.to_dict()
        )
        return PageOutcome(PageState.DONE, path)

    async def _settle(self) -> None:
        """Record the completions the store failed to take (it works again); those it fails again
        wait for the next recovery."""
        unrecorded, self._unrecorded = self._unrecorded, []
        for claim, attempt, outcome in unrecorded:
            try:
                await self._record(claim, attempt, outcome)
            except Exception:
                log.exception("job %s page %d: completion not recorded", claim.job_id, claim.seq)

    async def _record(self, claim: Claim, attempt: Attempt, outcome: PageOutcome) -> None:
        """Finish the page in the store, unless someone else already has; a completion the failing
        store does not take is kept for :meth:`_settle`."""
        try:
            completion = await self.store.complete(claim, outcome)
        except Exception as exc:
            if not self.health.report(exc):
                raise
            self._unrecorded.append((claim, attempt, outcome))
            return
        await self._counted(claim, attempt, outcome, completion)

    async def _counted(self, claim: Claim, attempt: Attempt, outcome: PageOutcome, completion: Completion) -> None:
        """Count a completion, or drop its result file when it did not count and the store does not
        hold that file (an earlier call of this completion may have been stored, its answer lost)."""
        if not completion.counted:
            metrics.JOB_PAGES.labels("duplicate").inc()
            if outcome.result_path and outcome.result_path not in await self._stored_paths(claim):
                await asyncio.to_thread(self.data.remove, outcome.result_path)
            return
        metrics.JOB_PAGES.labels(outcome.state).inc()
        self.pipeline.count_final(attempt)
        if completion.ended:
            await self.on_end(claim.job_id, completion.ended)

    async def _stored_paths(self, claim: Claim) -> set[str]:
        """The result files the store holds for the claim's page (one, or none)."""
        return {r.result_path for r in await self.store.pages(claim.job_id) if r.seq == claim.seq and r.result_path}

    async def _attempt(self, claim: Claim, job: Job, reservation: Reservation) -> Attempt:
        """Decode and OCR one page through the page pipeline.

        Raises:
            Exception: anything but a page's own failure (a broken decoding pool, an engine bug).
        """
        terms = self.terms(job)
        if terms.deadline_is_clients and terms.deadline.passed():
            problem = DeadlinePassed(f"page {claim.index + 1}: the job's deadline passed before it ran")
            reservation.release(1)
            return Attempt.failed(claim.index, problem)
        source = self.data.upload_path(claim.job_id, claim.document)
        try:
            page = await self._decode(source, job.documents[claim.document], claim.index, terms.engine_class)
        except ProblemError as problem:
            reservation.release(1)
            return Attempt.failed(claim.index, problem)
        return await self.pipeline.run(page, reservation, terms)

    async def _decode(self, source: Path, document: JobDocument, index: int, priority: int) -> Page | DecodeFailure:
        """The page ``index`` of a stored upload, or its :class:`DecodeFailure`, decoded at the job's
        engine class ``priority`` (after interactive pages waiting for a decoding process).

        Raises:
            ProblemError: the document itself cannot be opened any more (415).
        """
        chunks = self.preprocessor.pages(source, document.info(), [index], priority)
        async with contextlib.aclosing(chunks):
            (page,) = await anext(chunks)
        return page
