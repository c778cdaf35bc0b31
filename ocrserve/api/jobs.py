"""HTTP endpoints of durable jobs: submit, status, result, live events, cancel.

Also :func:`accept_job`, which ``POST /v1/ocr`` calls for ``Prefer: respond-async`` (RFC 7240).
Events are read from the job store, not from this process, so a client may follow a job on any
gateway sharing the store, and reconnect with ``Last-Event-ID`` to any of them.
"""

from __future__ import annotations

import asyncio
import io
import json

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from ocrserve.api.auth import require_api_key
from ocrserve.api.problems import PROBLEM_JSON
from ocrserve.api.routes import RAW_TYPES, parse_format, parse_timeout, render
from ocrserve.api.schemas import Problem as ProblemSchema
from ocrserve.errors import BadRequest, NotFound, Problem, UnsupportedMedia
from ocrserve.jobs.intake import Upload
from ocrserve.store.records import CANCELLED, Job
from ocrserve.jobs.results import job_result, job_status
from ocrserve.jobs.runtime import Jobs

api = APIRouter(dependencies=[Depends(require_api_key)], tags=["jobs"])
#: Form fields besides the files that a job submission may carry.
MAX_FIELDS = 16
#: Seconds between keep-alive comments on an idle event stream.
SSE_PING_S = 15


class JobConflict(Problem):
    """409: the job is not in a state that allows the request (result before the end, cancel after it)."""

    status = 409
    slug = "job-state"
    title = "Conflict with the job's state"


_problems = {
    code: {"model": ProblemSchema, "content": {PROBLEM_JSON: {}}, "description": what}
    for code, what in {400: "bad parameter or refused webhook_url", 404: "unknown job",
                       409: "Idempotency-Key reused with another request, or the job's state",
                       413: "too many bytes, pixels or pages", 415: "unsupported or undecodable file"}.items()
}
_submit_body = {
    "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file"],
        "properties": {
            "file": {"type": "array", "items": {"type": "string", "format": "binary"}},
            "pages": {"type": "string", "example": "1-3,5", "description": "pages of every document"},
            "priority": {"type": "integer", "minimum": 0, "description": "higher runs first"},
            "webhook_url": {"type": "string", "format": "uri"},
        },
    }}}},
    "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string"}}],
}


def jobs_of(request: Request) -> Jobs:
    """The app's job system."""
    return request.app.state.jobs


async def read_documents(request: Request, max_files: int) -> tuple[list[Upload], dict[str, str]]:
    """The uploads (multipart ``file`` fields, or one raw image/PDF body) and the other parameters
    (form fields, then query parameters).

    Raises:
        BadRequest: more than ``max_files`` files (or too many other fields).
        UnsupportedMedia: a body that is neither multipart nor an image/PDF media type.
    """
    params = dict(request.query_params)
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        try:
            form = await request.form(max_files=max_files, max_fields=MAX_FIELDS)
        except StarletteHTTPException as exc:  # too many parts
            raise BadRequest(f"{exc.detail} (jobs.max_files={max_files} documents and {MAX_FIELDS} other fields "
                             "per job)") from None
        params.update({k: v for k, v in form.items() if isinstance(v, str)})
        files = [f for f in form.getlist("file") if isinstance(f, UploadFile)]
        return [Upload(f.filename or f"document-{n}", f.file) for n, f in enumerate(files)], params
    if content_type and not content_type.startswith(RAW_TYPES):
        raise UnsupportedMedia(
            f"Content-Type {content_type!r}: send multipart/form-data with 'file' fields, or an image/* or "
            "application/pdf body")
    body = await request.body()
    return ([Upload(params.get("filename") or "document", io.BytesIO(body))] if body else []), params


async def accept_job(request: Request, *, sync_params: bool = False) -> JSONResponse:
    """Create a job from the request; 202 with ``Location`` and the job's status.

    An ``Idempotency-Key`` seen before with the same request answers with the earlier job
    (``Idempotent-Replayed: true``). ``X-Cache: hit`` when every page came from the dedup cache.
    With ``sync_params`` (``POST /v1/ocr`` with ``Prefer: respond-async``) the synchronous
    endpoint's ``timeout`` and ``format`` are checked as that endpoint checks them (400), though a
    job neither waits nor renders: a request is refused for the same mistakes either way.
    """
    jobs = jobs_of(request)
    uploads, params = await read_documents(request, jobs.config.jobs.max_files)
    if sync_params:
        parse_timeout(params.get("timeout"))
        parse_format(params.get("format"))
    submission = await jobs.intake.submit(uploads, params, request.headers.get("idempotency-key", ""))
    headers = {"Location": f"/v1/jobs/{submission.job.id}", "X-Cache": "hit" if submission.cached else "miss"}
    if not submission.created:
        headers["Idempotent-Replayed"] = "true"
    if "respond-async" in request.headers.get("prefer", ""):
        headers["Preference-Applied"] = "respond-async"
    return JSONResponse(await job_status(jobs.store, submission.job), status_code=202, headers=headers)


async def find_job(request: Request, job_id: str) -> Job:
    """The job, or a 404 problem."""
    job = await jobs_of(request).store.get(job_id)
    if job is None:
        raise NotFound(f"no job {job_id!r} (unknown, or deleted after jobs.retention_s)", slug="job-not-found")
    return job


@api.post("/v1/jobs", status_code=202, summary="Submit documents as a durable job",
          responses={202: {"description": "accepted; Location names the job"}, **_problems},
          openapi_extra=_submit_body)
async def submit_job(request: Request) -> JSONResponse:
    """Accept one or more documents (``file``, repeated) as one job and answer at once (202).

    Optional ``pages`` (applied to every document), ``priority`` (0 to ``jobs.max_priority``; higher
    runs first) and ``webhook_url`` (called when the job ends; its host must be on
    ``jobs.webhook_allow_hosts``); header ``Idempotency-Key``. Every document is inspected first:
    an unsupported, undecodable or too-large one refuses the whole job (415/413).
    """
    return await accept_job(request)


@api.get("/v1/jobs/{job_id}", summary="A job's status", responses={404: _problems[404]})
async def get_job(request: Request, job_id: str) -> dict:
    """Status (queued, running, succeeded, failed, partial, cancelled), ``pages_total``,
    ``pages_done`` (finished, failed ones included), ``pages_failed`` and each failed page's error."""
    job = await find_job(request, job_id)
    return await job_status(jobs_of(request).store, job)


@api.get("/v1/jobs/{job_id}/result", summary="A finished job's result",
         responses={404: _problems[404], 409: _problems[409]})
async def get_result(request: Request, job_id: str, format: str = "json") -> Response:
    """The result in ``format`` (json, text, markdown): the synchronous result's shape with lane
    ``bulk``, every page of every document in order (each with its ``document`` number) and a
    ``documents`` list. 409 while the job runs."""
    fmt = parse_format(format)
    jobs = jobs_of(request)
    job = await find_job(request, job_id)
    if not job.terminal:
        raise JobConflict(f"job {job_id} is {job.status} ({job.pages_done} of {job.pages_total} pages done)",
                          slug="job-not-finished", headers={"Retry-After": "1"})
    response = render(await job_result(jobs.store, jobs.data, job), fmt)
    response.headers["X-Cache"] = "hit" if all(d.cached for d in job.documents) else "miss"
    return response


@api.get("/v1/jobs/{job_id}/events", summary="A job's progress as Server-Sent Events",
         responses={200: {"content": {"text/event-stream": {}}}, 404: _problems[404]})
async def job_events(request: Request, job_id: str) -> EventSourceResponse:
    """One ``page`` event per finished page (``id`` counts from 1; data: page, document, index,
    state, error, pages_done, pages_total), in the order they finished, then one ``done`` event
    with the job's status. Reconnecting with ``Last-Event-ID`` resumes after that event."""
    await find_job(request, job_id)
    try:
        after = int(request.headers.get("last-event-id") or 0)
    except ValueError:
        after = 0
    return EventSourceResponse(_event_stream(jobs_of(request), job_id, after), ping=SSE_PING_S)


async def _event_stream(jobs: Jobs, job_id: str, after: int):
    while True:
        job = await jobs.store.get(job_id)  # first: events logged before an end are all read below
        for event in await jobs.store.events(job_id, after):
            yield ServerSentEvent(data=json.dumps(event.data), event="page", id=str(event.id))
            after = event.id
        if job is None:
            return
        if job.terminal:
            yield ServerSentEvent(data=json.dumps(await job_status(jobs.store, job)), event="done")
            return
        await asyncio.sleep(jobs.config.jobs.events_poll_s)


@api.delete("/v1/jobs/{job_id}", summary="Cancel a job", responses={404: _problems[404], 409: _problems[409]})
async def cancel_job(request: Request, job_id: str) -> dict:
    """Cancel a job: pages not yet in the engine never reach it; finished pages stay in its
    result. Cancelling a cancelled job is a no-op; one that ended otherwise is 409."""
    jobs = jobs_of(request)
    job = await find_job(request, job_id)
    if job.terminal and job.status != CANCELLED:
        raise JobConflict(f"job {job_id} already ended ({job.status})", slug="job-finished")
    if not job.terminal:
        job = await jobs.cancel(job_id)
    return await job_status(jobs.store, job)
