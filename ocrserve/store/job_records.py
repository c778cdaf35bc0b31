"""What the job store keeps: jobs, their documents, their pages (the unit of work) and outcomes.

A job holds one or more documents; each selected page of each document is one page of work (a
:class:`Claim` while a worker holds it), numbered ``seq`` 0..pages_total-1 across the job
(documents in order, pages in order). Times are
Unix seconds (``time.time()``; the Redis store uses the server's clock), so that every gateway
sharing a store agrees on leases and retention.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import asdict, dataclass, field

from ocrserve.preprocess import DocumentInfo

if sys.version_info >= (3, 11):
    StrEnum = enum.StrEnum
else:

    class StrEnum(str, enum.Enum):
        """``enum.StrEnum`` for Python 3.10: members are ``str``, and ``str()`` and ``format()`` give
        the value (``f"{JobStatus.QUEUED}"`` is ``"queued"``, as on 3.11+)."""

        def __str__(self) -> str:
            return self.value

        def __format__(self, spec: str) -> str:
            return format(self.value, spec)


class JobStatus(StrEnum):
    """A job's status. Members are the plain strings the stores keep and the API reports, so JSON
    dumps them as such and a stored ``"queued"`` equals ``JobStatus.QUEUED``."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PARTIAL = "partial"
    CANCELLED = "cancelled"


class PageState(StrEnum):
    """A page's state: waiting (or waiting to be retried), claimed, and the three final ones."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: The tenant of every job of a gateway without API keys (and of jobs stored before tenants existed).
ANONYMOUS = ""
#: Joins a tenant and its ``Idempotency-Key``: neither tenant names nor keys (printable ASCII) hold it.
_SCOPE_SEPARATOR = "\x1f"


def idempotency_scope(tenant: str, key: str) -> str:
    """What the stores index an ``Idempotency-Key`` under, one namespace per tenant ("" for no key).
    The anonymous tenant's keys are kept as sent, as they were before tenants existed."""
    return f"{tenant}{_SCOPE_SEPARATOR}{key}" if tenant and key else key


#: Statuses a job never leaves.
TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.PARTIAL, JobStatus.CANCELLED})


def page_event(seq: int, document: int, index: int, outcome: PageOutcome) -> dict:
    """The event a finished page appends to its job's log; the store adds ``pages_done`` (pages
    finished so far, this one included) and ``pages_total``."""
    event = {"page": seq, "document": document, "index": index, "state": outcome.state}
    if outcome.error:
        event["error"] = outcome.error
    return event


def final_status(pages_ok: int, pages_failed: int) -> JobStatus:
    """The status of a job whose every page has finished."""
    if not pages_failed:
        return JobStatus.SUCCEEDED
    return JobStatus.FAILED if not pages_ok else JobStatus.PARTIAL


@dataclass
class JobDocument:
    """One uploaded document of a job, as inspected at submission.

    Attributes:
        name: the file name the client sent.
        sha256: hex digest of the file's bytes.
        size: bytes.
        kind, page_count, sizes, frames: its :class:`~ocrserve.preprocess.DocumentInfo`.
        indices: the 0-based pages selected (``pages`` parameter), in order.
        cache_key: its dedup-cache key (see ``ocrserve.store.cache``), or "" with the cache off.
        cached: True when its results came from the dedup cache at submission.
    """

    name: str
    sha256: str
    size: int
    kind: str
    page_count: int
    sizes: list[list[int]]
    frames: list[int]
    indices: list[int]
    cache_key: str = ""
    cached: bool = False

    @classmethod
    def from_info(
        cls, name: str, sha256: str, size: int, info: DocumentInfo, indices: list[int], cache_key: str = ""
    ) -> JobDocument:
        """A document record from what the preprocessor learned about it."""
        return cls(
            name,
            sha256,
            size,
            info.kind,
            info.page_count,
            [list(s) for s in info.sizes],
            list(info.frames),
            list(indices),
            cache_key,
        )

    def info(self) -> DocumentInfo:
        """The :class:`~ocrserve.preprocess.DocumentInfo` to decode its pages with."""
        return DocumentInfo(self.kind, self.page_count, tuple(tuple(s) for s in self.sizes), tuple(self.frames))


@dataclass
class Job:
    """A job as the store keeps it.

    Attributes:
        id: 32 hex digits.
        status: queued, running, succeeded, failed, partial or cancelled.
        priority: 0..``jobs.max_priority``; pages of higher-priority jobs are claimed first.
        created, finished: Unix seconds (``finished`` 0 while the job runs).
        documents: the uploads, in the order they were sent.
        model: the engine's model id when the job was accepted.
        webhook_url: called when the job ends ("" for none).
        request_hash: sha256 of the request (files and parameters), for ``Idempotency-Key``.
        pages_ok, pages_failed: finished pages by outcome, each counted once.
        deadline: Unix seconds by which its pages must be done (the submission's ``timeout``), 0 for none.
        tenant: who owns the job (:data:`ANONYMOUS` when the gateway has no API keys); only its
            keys may read or cancel it.
        request_id: the id of the request that created it (``X-Request-ID``); log lines about
            its pages carry it ("" for jobs stored before request ids).
    """

    id: str
    status: JobStatus
    priority: int
    created: float
    documents: list[JobDocument]
    model: str
    webhook_url: str = ""
    request_hash: str = ""
    pages_ok: int = 0
    pages_failed: int = 0
    finished: float = 0.0
    deadline: float = 0.0
    tenant: str = ANONYMOUS
    request_id: str = ""

    @property
    def pages_total(self) -> int:
        """Pages in the job, across its documents."""
        return sum(len(d.indices) for d in self.documents)

    @property
    def pages_done(self) -> int:
        """Pages finished, whatever their outcome."""
        return self.pages_ok + self.pages_failed

    @property
    def terminal(self) -> bool:
        """True once the job will not change any more."""
        return self.status in TERMINAL

    def page_refs(self) -> list[tuple[int, int]]:
        """``(document, page index)`` of each ``seq``, in order."""
        return [(d, i) for d, doc in enumerate(self.documents) for i in doc.indices]

    def to_json(self) -> dict:
        """A JSON-ready dict the stores persist (``from_json`` restores it)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Job:
        """The job :meth:`to_json` wrote."""
        return cls(
            **{**data, "status": JobStatus(data["status"]), "documents": [JobDocument(**d) for d in data["documents"]]}
        )


@dataclass
class Claim:
    """A claimed page: the worker holds it for ``jobs.lease_s`` unless it renews the lease.

    Attributes:
        job_id, seq: which page of which job.
        document, index: its document (0-based, within the job) and page within that document.
        attempts: claims of this page so far, this one included.
        token: this claim's random id; renewals and retries must present it.
        lapsed_from: the owner of the page's previous claim when that claim's lease lapsed (its
            gateway crashed or stalled), else "" (a first claim, or one after a retry or release).
    """

    job_id: str
    seq: int
    document: int
    index: int
    attempts: int
    token: str
    lapsed_from: str = ""


@dataclass
class PageOutcome:
    """How a page ended: ``done`` with its result file, or ``failed`` with a problem object."""

    state: PageState
    result_path: str = ""
    error: dict | None = None


@dataclass
class PageRecord:
    """A page of a job as the store reports it (for results and status)."""

    seq: int
    document: int
    index: int
    state: PageState
    attempts: int = 0
    result_path: str = ""
    error: dict | None = None


@dataclass
class Completion:
    """What :meth:`JobStore.complete` did.

    Attributes:
        counted: True when this call finished the page (False: it was already finished, or the job
            was cancelled; the caller's result is discarded).
        ended: the job's final status when this completion finished the job, else "".
    """

    counted: bool
    ended: JobStatus | str = ""


@dataclass
class Event:
    """One entry of a job's event log: a page finished (``id`` counts from 1)."""

    id: int
    data: dict = field(default_factory=dict)
