"""Problems that reach the client as RFC 9457 problem details (``application/problem+json``).

Every error a request can cause is a :class:`ProblemError` carrying its HTTP status; the API turns it
into ``{"type", "title", "status", "detail"}``. Problems are plain picklable exceptions so that
they cross process-pool boundaries unchanged.
"""

from __future__ import annotations

PROBLEM_BASE = "https://ocrserve.dev/problems/"


class ProblemError(Exception):
    """An error with an HTTP status, a short stable title and a human-readable detail.

    Attributes:
        status: HTTP status code (4xx for the client's fault, 5xx for ours).
        slug: last segment of the problem ``type`` URI, e.g. ``"too-many-pixels"``.
        title: short summary that does not change between occurrences.
        detail: what happened this time, naming the limit or value at fault.
        headers: extra response headers (``Retry-After`` for 503/429).
    """

    status = 500
    slug = "internal"
    title = "Internal error"

    def __init__(self, detail: str, *, slug: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.detail = detail
        if slug is not None:
            self.slug = slug
        self.headers = headers or {}

    def __reduce__(self):
        return (_rebuild, (type(self), self.detail, self.slug, self.headers))

    @property
    def type(self) -> str:
        """The problem ``type`` URI."""
        return PROBLEM_BASE + self.slug

    def to_dict(self) -> dict:
        """The problem-details body (RFC 9457 section 3)."""
        return {"type": self.type, "title": self.title, "status": self.status, "detail": self.detail}


def _rebuild(cls, detail, slug, headers):
    return cls(detail, slug=slug, headers=headers)


class BadRequest(ProblemError):
    """400: a parameter is malformed (``pages``, ``timeout``, ``format``)."""

    status = 400
    slug = "bad-request"
    title = "Bad request"


class NotFound(ProblemError):
    """404: no such resource."""

    status = 404
    slug = "not-found"
    title = "Not found"


class PayloadTooLarge(ProblemError):
    """413: the upload exceeds a limit on bytes, pixels per page or pages per document."""

    status = 413
    slug = "too-large"
    title = "Payload too large"


class UnsupportedMedia(ProblemError):
    """415: the file is not a supported document type, or it cannot be decoded."""

    status = 415
    slug = "unsupported-media-type"
    title = "Unsupported or undecodable file"


class PoisonDocument(ProblemError):
    """422: decoding the document exhausted its worker process (memory or time limit) or killed it;
    it is not tried again."""

    status = 422
    slug = "poison-document"
    title = "Document exhausts the decoder"


class Overloaded(ProblemError):
    """503 (or 429 where configured): the server cannot queue more work now; see ``Retry-After``."""

    status = 503
    slug = "overloaded"
    title = "Overloaded"


class TooManyRequests(ProblemError):
    """429 (RFC 6585 section 4): the client's rate limit or its tenant's quota is used up; see ``Retry-After``."""

    status = 429
    slug = "rate-limited"
    title = "Too many requests"


class StoreUnavailable(ProblemError):
    """503: the job store (or the data folder) is not taking writes now; see ``Retry-After``."""

    status = 503
    slug = "store-unavailable"
    title = "Job store unavailable"


class InsufficientStorage(ProblemError):
    """507 (RFC 4918 section 11.5): the data folder is full, so an upload or a job cannot be kept.

    507 rather than 503: the server is not busy, it is out of room, which waiting a few seconds
    does not cure (an operator, or retention, must free space). Clients and monitors can tell the
    two apart, and generic retry-on-503 loops do not re-send whole uploads into a full disk. No
    ``Retry-After`` for the same reason.
    """

    status = 507
    slug = "insufficient-storage"
    title = "Insufficient storage"


class EngineUnavailable(ProblemError):
    """503: the OCR engine is not loaded or not answering."""

    status = 503
    slug = "engine-unavailable"
    title = "Engine unavailable"


class EngineRefused(ProblemError):
    """422: the engine's server refused the page with a 4xx of its own (vLLM's 400 for a page with
    more tokens than its ``max_model_len``): the page is well-formed, yet this model will never take
    it, so sending it again cannot help (unlike 502, which clients retry)."""

    status = 422
    slug = "engine-refused"
    title = "Engine refused the page"


class EngineFailed(ProblemError):
    """502: the OCR engine failed on a page."""

    status = 502
    slug = "engine-failed"
    title = "Engine failed"


class DeadlinePassed(ProblemError):
    """504: the request's deadline (``timeout``) passed before its pages were done."""

    status = 504
    slug = "deadline"
    title = "Deadline passed"


class RequestTimeout(ProblemError):
    """408: the client stopped sending its request body (``server.read_timeout_s``)."""

    status = 408
    slug = "request-timeout"
    title = "Request timeout"


class ClientGone(ProblemError):
    """499 (nginx's "client closed request"): the client disconnected; nobody reads the answer."""

    status = 499
    slug = "client-closed-request"
    title = "Client closed request"
