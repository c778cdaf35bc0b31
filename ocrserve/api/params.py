"""The request parameters of ``POST /v1/ocr`` and ``POST /v1/jobs``, typed for FastAPI, and the
rendering of a result in the requested ``format``.

Every parameter is accepted as a form field or as a query parameter (the only way to send one
with a raw-body upload); the form field wins when both are sent. Each is read by one dependency
here, so both endpoints parse it the same way and only once. A malformed value is a 400 problem
(see :mod:`ocrserve.api.problems`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import Depends, Form, Header, Query
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BeforeValidator, Field

from ocrserve.errors import BadRequest
from ocrserve.formats import MEDIA_TYPES, Format, render_markdown, render_text
from ocrserve.work import Deadline, WorkItem

#: Largest ``timeout`` a request may ask for, seconds.
MAX_TIMEOUT_S = 3600.0
#: Smallest ``timeout`` a request may ask for, seconds: below what any page takes. The quickest page
#: there is, a blank 8 x 8 PNG (no engine, no cache: inspected and decoded in a decoding process,
#: two round trips, then answered blank), took 4.5 ms from the start of its deadline to its answer
#: (``usage.seconds``; 11-36 ms at the client) on 2 busy cores; a timeout under a fifth of that
#: could only ever end in a 503 or 504, so it is a 400 that says so.
MIN_TIMEOUT_S = 0.001
#: The lane each synchronous ``priority`` forces (see :mod:`ocrserve.work`).
PRIORITY_LANES = {"interactive": "fast", "bulk": "bulk"}

T = TypeVar("T")


def _blank_is_none(value: object) -> object:
    return None if value == "" else value


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


Blank = BeforeValidator(_blank_is_none)
#: ``format`` as sent: any case.
AnyCaseFormat = Annotated[Format, BeforeValidator(_lower)]
Seconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)]
JobPriority = Annotated[int, Field(ge=0)]

_PAGES = "1-based pages and ranges, e.g. 1-3,5 (default: all)"
_TIMEOUT = f"seconds, {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g}; pages not done by then fail with 504"
_FORMAT = "json (default), text or markdown"
_SYNC_PRIORITY = (
    "interactive forces the fast lane, bulk the bulk lane (default: by size); with Prefer: respond-async, "
    "the job's priority, 0 (default) to jobs.max_priority, higher first"
)
_JOB_PRIORITY = "0 (default) to jobs.max_priority; higher runs first"
_WEBHOOK = "called when the job ends; its host must be on jobs.webhook_allow_hosts"
_FILENAME = "the document's name when it is sent as the raw body"


def _either(form: T | None, query: T | None) -> T | None:
    return form if form is not None else query


def pages_param(
    pages_form: Annotated[str | None, Blank, Form(alias="pages", description=_PAGES, examples=["1-3,5"])] = None,
    pages_query: Annotated[str | None, Blank, Query(alias="pages", description=_PAGES)] = None,
) -> str | None:
    """``pages``, checked against the document later (``DocumentInfo.select``)."""
    return _either(pages_form, pages_query)


def timeout_param(
    timeout_form: Annotated[Seconds | None, Blank, Form(alias="timeout", description=_TIMEOUT)] = None,
    timeout_query: Annotated[Seconds | None, Blank, Query(alias="timeout", description=_TIMEOUT)] = None,
) -> float | None:
    """``timeout`` in seconds, in ``[MIN_TIMEOUT_S, MAX_TIMEOUT_S]``, or None: the one place it is
    parsed, for the synchronous request's deadline and a job's alike.

    Raises:
        BadRequest: a timeout below :data:`MIN_TIMEOUT_S` (above :data:`MAX_TIMEOUT_S`, zero or no
            number: FastAPI's validation, a 400 too).
    """
    timeout = _either(timeout_form, timeout_query)
    if timeout is not None and timeout < MIN_TIMEOUT_S:
        raise BadRequest(
            f"timeout={timeout:g} s is shorter than any page takes (at least {MIN_TIMEOUT_S:g} s: a blank "
            "page, decoded and answered without OCR); send a longer one, or none for the lane's default"
        )
    return timeout


def format_param(
    format_form: Annotated[AnyCaseFormat | None, Blank, Form(alias="format", description=_FORMAT)] = None,
    format_query: Annotated[AnyCaseFormat | None, Blank, Query(alias="format", description=_FORMAT)] = None,
) -> Format:
    """``format`` of the result (``json`` when absent)."""
    return _either(format_form, format_query) or "json"


def priority_param(
    priority_form: Annotated[str | None, Blank, Form(alias="priority", description=_SYNC_PRIORITY)] = None,
    priority_query: Annotated[str | None, Blank, Query(alias="priority", description=_SYNC_PRIORITY)] = None,
) -> str | None:
    """``priority`` of ``POST /v1/ocr`` as sent; what it may be depends on ``Prefer`` (:func:`ocr_params`)."""
    return _either(priority_form, priority_query)


def job_priority_param(
    priority_form: Annotated[JobPriority | None, Blank, Form(alias="priority", description=_JOB_PRIORITY)] = None,
    priority_query: Annotated[JobPriority | None, Blank, Query(alias="priority", description=_JOB_PRIORITY)] = None,
) -> int | None:
    """A job's ``priority``; its upper bound (``jobs.max_priority``) is the intake's to check."""
    return _either(priority_form, priority_query)


def webhook_url_param(
    webhook_url_form: Annotated[str | None, Blank, Form(alias="webhook_url", description=_WEBHOOK)] = None,
    webhook_url_query: Annotated[str | None, Blank, Query(alias="webhook_url", description=_WEBHOOK)] = None,
) -> str | None:
    """A job's ``webhook_url``, checked by the intake (``jobs.webhooks.check_webhook_url``)."""
    return _either(webhook_url_form, webhook_url_query)


def filename_param(filename: Annotated[str | None, Blank, Query(description=_FILENAME)] = None) -> str | None:
    """The name a job records for a raw-body document."""
    return filename


#: The ``Idempotency-Key`` header of a job submission.
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="a job submission: the same key with the same request answers with the earlier job",
    ),
]
#: The ``Prefer`` header of ``POST /v1/ocr`` (RFC 7240).
PreferHeader = Annotated[str | None, Header(alias="Prefer", description="respond-async: make the document a job (202)")]


def prefers_async(prefer: str | None) -> bool:
    """Whether a ``Prefer`` header asks for ``respond-async`` (RFC 7240)."""
    return "respond-async" in (prefer or "")


@dataclass(frozen=True)
class JobParams:
    """What a job submission asks for, besides its documents."""

    pages: str | None = None
    timeout: float | None = None
    priority: int | None = None
    webhook_url: str | None = None
    filename: str | None = None

    def terms(self) -> dict:
        """The parameters for ``Intake.submit``: ``pages``, ``priority``, ``webhook_url`` as
        strings and ``timeout`` as the validated number of seconds; absent ones left out."""
        terms = {
            "pages": self.pages,
            "priority": None if self.priority is None else str(self.priority),
            "webhook_url": self.webhook_url,
            "timeout": self.timeout,
        }
        return {key: value for key, value in terms.items() if value is not None}


@dataclass(frozen=True)
class OcrParams:
    """What a synchronous request asks for; ``webhook_url`` and ``filename`` matter only with
    ``Prefer: respond-async``."""

    pages: str | None = None
    timeout: float | None = None
    format: Format = "json"
    lane: str | None = None
    job_priority: int | None = None
    webhook_url: str | None = None
    filename: str | None = None

    def work_item(self, arrived: float | None = None) -> WorkItem:
        """The scheduling terms for the core: the deadline ``timeout`` from when the request
        ``arrived`` (``time.monotonic()``; None: now), and the lane. From arrival, not from once
        the upload was read: a 2-page PDF of scans admitted beside a busy core was answered 200
        after its client's 45 s, within the 45 s the gateway had counted from later."""
        arrived = arrived or time.monotonic()
        deadline = Deadline(arrived + self.timeout) if self.timeout else None
        return WorkItem(deadline=deadline, lane=self.lane, arrived=arrived)

    def as_job(self) -> JobParams:
        """The same request as a job (``Prefer: respond-async``), which renders nothing."""
        return JobParams(
            pages=self.pages,
            timeout=self.timeout,
            priority=self.job_priority,
            webhook_url=self.webhook_url,
            filename=self.filename,
        )


def ocr_params(
    pages: Annotated[str | None, Depends(pages_param)],
    timeout: Annotated[float | None, Depends(timeout_param)],
    fmt: Annotated[Format, Depends(format_param)],
    priority: Annotated[str | None, Depends(priority_param)],
    webhook_url: Annotated[str | None, Depends(webhook_url_param)],
    filename: Annotated[str | None, Depends(filename_param)],
    prefer: PreferHeader = None,
) -> OcrParams:
    """FastAPI dependency: the parameters of ``POST /v1/ocr``. ``priority`` is ``interactive`` or
    ``bulk`` (the lane), or with ``Prefer: respond-async`` the job's integer priority.

    Raises:
        BadRequest: a ``priority`` that is neither.
    """
    lane, job_priority = None, None
    if priority is not None and prefers_async(prefer):
        if not (priority.isascii() and priority.isdigit()):
            raise BadRequest(f"priority={priority!r}: a job's priority is an integer from 0 (higher runs first)")
        job_priority = int(priority)
    elif priority is not None:
        if priority.lower() not in PRIORITY_LANES:
            raise BadRequest(f"priority={priority!r}: expected interactive or bulk")
        lane = PRIORITY_LANES[priority.lower()]
    return OcrParams(
        pages=pages,
        timeout=timeout,
        format=fmt,
        lane=lane,
        job_priority=job_priority,
        webhook_url=webhook_url,
        filename=filename,
    )


def job_params(
    pages: Annotated[str | None, Depends(pages_param)],
    timeout: Annotated[float | None, Depends(timeout_param)],
    priority: Annotated[int | None, Depends(job_priority_param)],
    webhook_url: Annotated[str | None, Depends(webhook_url_param)],
    filename: Annotated[str | None, Depends(filename_param)],
) -> JobParams:
    """FastAPI dependency: the parameters of ``POST /v1/jobs``."""
    return JobParams(pages=pages, timeout=timeout, priority=priority, webhook_url=webhook_url, filename=filename)


def render(result: dict, fmt: Format) -> Response:
    """The result in ``fmt``."""
    if fmt == "text":
        return PlainTextResponse(render_text(result), media_type=MEDIA_TYPES["text"])
    if fmt == "markdown":
        return Response(render_markdown(result), media_type=MEDIA_TYPES["markdown"])
    return JSONResponse(result)
