"""The job store interface (:func:`ocrserve.store.open_store` picks an implementation from ``store.url``).

Pages are the unit of work. A worker *claims* pages (:meth:`JobStore.claim`): each claim carries a
lease (visibility timeout) the worker renews while it works (:meth:`JobStore.renew`); a page whose
lease runs out (its claimant died) is handed out again. Delivery is therefore at least once, but
:meth:`JobStore.complete` is conditional, so each page is counted, logged as an event and put in
the result exactly once. Transient failures go back to the queue after a backoff
(:meth:`JobStore.retry_later`).

Implementations: :class:`~ocrserve.store.sqlite_store.SqliteStore` (one file, WAL; the embedded
default) and :class:`~ocrserve.store.redis_store.RedisStore` (several gateways sharing the work).
"""

from __future__ import annotations

import abc

from ocrserve.errors import ProblemError, TooManyRequests
from ocrserve.store.job_records import Claim, Completion, Event, Job, PageOutcome, PageRecord

#: ``Retry-After`` of a submission refused by its tenant's quota, seconds: pages take about a
#: second each, so some of a full queue's have finished by then.
QUOTA_RETRY_AFTER_S = 10


class IdempotencyConflict(ProblemError):
    """409: the ``Idempotency-Key`` was used before with a different request."""

    status = 409
    slug = "idempotency-conflict"
    title = "Idempotency key reused"


def quota_exceeded(tenant: str, pending: int, adding: int, limit: int) -> TooManyRequests:
    """The 429 of a job whose ``adding`` pages would take its tenant's ``pending`` ones above ``limit``."""
    return TooManyRequests(
        f"tenant {tenant or 'anonymous'} has {pending} pages queued or running; this job's {adding} more would "
        f"pass its quota of {limit} (jobs.max_queued_pages_per_tenant, or the API key's max_queued_pages)",
        slug="tenant-quota",
        headers={"Retry-After": str(QUOTA_RETRY_AFTER_S)},
    )


class JobStore(abc.ABC):
    """Durable jobs, pages, leases, events, idempotency keys and the dedup-cache index.

    Every method is a coroutine; every multi-step change is atomic (a transaction or a script).
    """

    @abc.abstractmethod
    async def create(
        self,
        job: Job,
        idempotency_key: str = "",
        finished: dict[int, PageOutcome] | None = None,
        max_pending_pages: int = 0,
    ) -> tuple[Job, bool]:
        """Store a new job with its pages queued, all in one step.

        Args:
            job: the job (status ``queued``), owned by ``job.tenant``.
            idempotency_key: when set and seen before, from the same tenant, with the same
                ``job.request_hash``, the earlier job is returned instead. Each tenant has its own keys.
            finished: outcomes of pages already known (dedup-cache hits), by ``seq``; they are
                finished at once, with their events. A job finished entirely ends here.
            max_pending_pages: the tenant's quota: refuse the job when its pages still to run would
                take :meth:`pending_pages` above this; 0 = no quota.

        Returns:
            ``(job, created)``: the stored job, and False when it is an earlier one.

        Raises:
            IdempotencyConflict: the key was used with a different request.
            TooManyRequests: the quota (see :func:`quota_exceeded`); nothing was stored.
        """

    @abc.abstractmethod
    async def pending_pages(self, tenant: str) -> int:
        """Pages of ``tenant``'s jobs that are queued or running (jobs stored by a version without
        tenants are not counted in the Redis store)."""

    @abc.abstractmethod
    async def get(self, job_id: str) -> Job | None:
        """The job, or None if unknown (or deleted by retention)."""

    @abc.abstractmethod
    async def pages(self, job_id: str) -> list[PageRecord]:
        """Every page of the job, in ``seq`` order."""

    @abc.abstractmethod
    async def claim(self, owner: str, limit: int, lease_s: float) -> list[Claim]:
        """Claim up to ``limit`` pages: queued ones whose retry time has come, and running ones
        whose lease expired; pages of higher-priority jobs first, then older jobs, then in order.

        Args:
            owner: the claiming worker (for logs and status).
            lease_s: seconds until the claim lapses unless renewed.
        """

    @abc.abstractmethod
    async def renew(self, claims: list[Claim], lease_s: float) -> list[Claim]:
        """Extend the leases of ``claims`` by ``lease_s`` from now.

        Returns:
            The claims that are no longer this worker's to run: re-claimed by another worker after a
            lapse, finished, or cancelled with their job. Their work should stop.
        """

    @abc.abstractmethod
    async def complete(self, claim: Claim, outcome: PageOutcome) -> Completion:
        """Finish a page, if nobody has yet: count it, append its event, end the job after its last page.

        Whoever finishes first wins, whether or not its lease is still current; a later completion of
        the same page (or one of a cancelled job) is not counted.
        """

    @abc.abstractmethod
    async def retry_later(self, claim: Claim, delay_s: float) -> bool:
        """Put a claimed page back in the queue, claimable again after ``delay_s`` seconds.

        Returns:
            False when the claim was no longer current (nothing changed).
        """

    @abc.abstractmethod
    async def release(self, claim: Claim) -> bool:
        """Give a claimed page back unworked (shutdown): queued at once, this attempt not counted."""

    @abc.abstractmethod
    async def cancel(self, job_id: str) -> Job | None:
        """Cancel a job that has not ended: its unfinished pages will not be handed out.

        Returns:
            The job after the call (unchanged if it had already ended), or None if unknown.
        """

    @abc.abstractmethod
    async def events(self, job_id: str, after: int = 0) -> list[Event]:
        """The job's page events with ``id > after``, in order."""

    @abc.abstractmethod
    async def claim_webhook(self, lease_s: float) -> Job | None:
        """An ended job whose webhook is due and not being sent by someone else (leased for
        ``lease_s``), or None."""

    @abc.abstractmethod
    async def webhook_done(self, job_id: str) -> None:
        """The job's webhook was delivered or given up: never send it again."""

    @abc.abstractmethod
    async def expired(self, before: float, limit: int = 100) -> list[str]:
        """Ids of jobs that ended before ``before`` (Unix seconds), oldest first."""

    @abc.abstractmethod
    async def delete(self, job_id: str) -> None:
        """Forget the job: its pages, events and idempotency key."""

    @abc.abstractmethod
    async def cache_touch(self, key: str) -> bool:
        """Mark a dedup-cache entry as just used; False if the cache has no such entry."""

    @abc.abstractmethod
    async def cache_add(self, key: str, max_entries: int) -> list[str]:
        """Index a dedup-cache entry as just used, evicting least recently used ones beyond
        ``max_entries``.

        Returns:
            The evicted keys (their files are the caller's to delete).
        """

    @abc.abstractmethod
    async def backlog(self) -> int:
        """Pages waiting to be claimed or running, across all jobs."""

    @abc.abstractmethod
    async def open_jobs(self) -> dict[str, int]:
        """Jobs not ended yet, of every tenant, by status: ``{"queued": n, "running": n}`` (running:
        a page of it was claimed)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections."""
