"""HTTP endpoints of durable jobs: submit, status, result, live events, cancel.

Also :func:`accept_job`, which ``POST /v1/ocr`` calls for ``Prefer: respond-async`` (RFC 7240).
Events are read from the job store, not from this process, so a client may follow a job on any
gateway sharing the store, and reconnect with ``Last-Event-ID`` to any of them.

A job belongs to the tenant of the key that submitted it (:mod:`ocrserve.api.tenants`): for any
other tenant it does not exist (404, the answer to an unknown id).
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

from fastapi import APIRouter, Depends, File, Query, Request, UploadFile
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from ocrserve.api.auth import principal_of, require_api_key
from ocrserve.api.params import AnyCaseFormat, IdempotencyKey, JobParams, job_params, prefers_async, render
from ocrserve.api.problems import PROBLEM_JSON
from ocrserve.api.schemas import Problem as ProblemSchema
from ocrserve.api.uploads import RAW_BODY_OPENAPI, UploadRoute, form_limits, job_uploads
from ocrserve.errors import NotFound, ProblemError
from ocrserve.jobs.intake import Upload
from ocrserve.jobs.results import job_result, job_status
from ocrserve.jobs.runtime import Jobs
from ocrserve.store.job_records import Job, JobStatus

#: Seconds between keep-alive comments on an idle event stream.
SSE_PING_S = 15


class JobConflict(ProblemError):
    """409: the job is not in a state that allows the request (result before the end, cancel after it)."""

    status = 409
    slug = "job-state"
    title = "Conflict with the job's state"


_problems = {
    code: {"model": ProblemSchema, "content": {PROBLEM_JSON: {}}, "description": what}
    for code, what in {
        400: "bad parameter or refused webhook_url",
        401: "no API key (server.api_keys is set)",
        403: "the API key is not valid",
        404: "unknown job, or another tenant's",
        409: "Idempotency-Key reused with another request, or the job's state",
        413: "too many bytes, pixels or pages",
        415: "unsupported or undecodable file",
        422: "the document exhausts or kills its decoding process (memory or time limit)",
        429: "the key's rate limit, the address's failed authentications or (on submission) the tenant's "
        "quota of queued pages; see Retry-After",
        503: "the job store is failing; see Retry-After",
        507: "the data folder is full: the job cannot be kept",
    }.items()
}
_problems[429]["headers"] = {
    name: {"description": what, "schema": {"type": "string" if name != "Retry-After" else "integer"}}
    for name, what in {
        "Retry-After": "seconds until a retry may succeed",
        "RateLimit-Policy": "the limit (draft-ietf-httpapi-ratelimit-headers), also on allowed responses",
        "RateLimit": "what is left of it, also on allowed responses",
    }.items()
}

api = APIRouter(
    dependencies=[Depends(require_api_key)],
    tags=["jobs"],
    route_class=UploadRoute,
    responses={code: _problems[code] for code in (401, 403, 429)},
)


def jobs_of(request: Request) -> Jobs:
    """The app's job system."""
    return request.app.state.jobs


async def accept_job(
    request: Request, uploads: list[Upload], params: JobParams, idempotency_key: str | None, *, respond_async: bool
) -> JSONResponse:
    """Create a job of ``uploads``; 202 with ``Location`` and the job's status. The uploads are
    closed once the intake has staged them.

    An ``Idempotency-Key`` seen before with the same request answers with the earlier job
    (``Idempotent-Replayed: true``). ``X-Cache: hit`` when every page came from the dedup cache.
    ``Preference-Applied: respond-async`` when the request's ``Prefer`` asked for it. The job, and
    the ``Idempotency-Key``, are the tenant's of the request's API key, under its quota of queued pages.
    """
    principal = principal_of(request)
    try:
        submission = await jobs_of(request).intake.submit(
            uploads,
            params.terms(),
            idempotency_key or "",
            tenant=principal.tenant,
            max_queued_pages=principal.max_queued_pages,
        )
    finally:
        for upload in uploads:
            upload.file.close()
    headers = {"Location": f"/v1/jobs/{submission.job.id}", "X-Cache": "hit" if submission.cached else "miss"}
    if not submission.created:
        headers["Idempotent-Replayed"] = "true"
    if respond_async:
        headers["Preference-Applied"] = "respond-async"
    return JSONResponse(await job_status(jobs_of(request).store, submission.job), status_code=202, headers=headers)


async def find_job(request: Request, job_id: str) -> Job:
    """The job, if the request's tenant owns it; else the 404 of an unknown id, so that whether
    another tenant's job exists does not show."""
    job = await jobs_of(request).store.get(job_id)
    if job is None or job.tenant != principal_of(request).tenant:
        raise NotFound(f"no job {job_id!r} (unknown, or deleted after jobs.retention_s)", slug="job-not-found")
    return job


@api.post(
    "/v1/jobs",
    status_code=202,
    summary="Submit documents as a durable job",
    responses={202: {"description": "accepted; Location names the job"}, **_problems},
    openapi_extra=RAW_BODY_OPENAPI,
)
@form_limits(lambda config: (config.jobs.max_files, f"jobs.max_files={config.jobs.max_files} documents per job"))
async def submit_job(
    request: Request,
    params: Annotated[JobParams, Depends(job_params)],
    file: Annotated[list[UploadFile] | None, File(description="a document; repeat the field for more")] = None,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    """Accept one or more documents (``file``, repeated; at most ``jobs.max_files``) as one job and
    answer at once (202). One document may instead be the raw body with its media type (image/*,
    application/pdf, application/octet-stream; name it with the query parameter ``filename``).

    Optional, as form fields or query parameters: ``pages`` (applied to every document),
    ``timeout`` (seconds after the 202 by which its pages must be done), ``priority``
    (0 to ``jobs.max_priority``; higher runs first) and ``webhook_url`` (called when the job ends;
    its host must be on ``jobs.webhook_allow_hosts``); header ``Idempotency-Key``. Every document is
    inspected first: an unsupported, undecodable or too-large one refuses the whole job (415/413).
    """
    uploads = await job_uploads(request, file, params.filename)
    return await accept_job(
        request, uploads, params, idempotency_key, respond_async=prefers_async(request.headers.get("prefer"))
    )


@api.get("/v1/jobs/{job_id}", summary="A job's status", responses={404: _problems[404]})
async def get_job(request: Request, job_id: str) -> dict:
    """Status (queued, running, succeeded, failed, partial, cancelled), ``pages_total``,
    ``pages_done`` (finished, failed ones included), ``pages_failed`` and each failed page's error."""
    job = await find_job(request, job_id)
    return await job_status(jobs_of(request).store, job)


@api.get(
    "/v1/jobs/{job_id}/result", summary="A finished job's result", responses={404: _problems[404], 409: _problems[409]}
)
async def get_result(
    request: Request,
    job_id: str,
    format: Annotated[AnyCaseFormat, Query(description="json (default), text or markdown")] = "json",
) -> Response:
    """The result in ``format`` (json, text, markdown): the synchronous result's shape with lane
    ``bulk``, every page of every document in order (each with its ``document`` number) and a
    ``documents`` list. 409 while the job runs."""
    jobs = jobs_of(request)
    job = await find_job(request, job_id)
    if not job.terminal:
        raise JobConflict(
            f"job {job_id} is {job.status} ({job.pages_done} of {job.pages_total} pages done)",
            slug="job-not-finished",
            headers={"Retry-After": "1"},
        )
    response = render(await job_result(jobs.store, jobs.data, job), format)
    response.headers["X-Cache"] = "hit" if all(d.cached for d in job.documents) else "miss"
    return response


@api.get(
    "/v1/jobs/{job_id}/events",
    summary="A job's progress as Server-Sent Events",
    responses={200: {"content": {"text/event-stream": {}}}, 404: _problems[404]},
)
async def job_events(request: Request, job_id: str) -> EventSourceResponse:
    """One ``page`` event per finished page (``id`` counts from 1; data: page, document, index,
    state, error, pages_done, pages_total), in the order they finished, then one ``done`` event
    with the job's status. Reconnecting with ``Last-Event-ID`` resumes after that event."""
    await find_job(request, job_id)
    after = last_event_id(request.headers.get("last-event-id"))
    return EventSourceResponse(_event_stream(jobs_of(request), job_id, after), ping=SSE_PING_S)


def last_event_id(raw: str | None) -> int:
    """The event a reconnecting client saw last: its ``Last-Event-ID`` if that is an event id (1 to
    2**63 - 1, what the stores can hold), else 0 (replay from the start)."""
    try:
        after = int(raw or 0)
    except ValueError:
        return 0
    return after if 0 < after < 2**63 else 0


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
    if job.terminal and job.status != JobStatus.CANCELLED:
        raise JobConflict(f"job {job_id} already ended ({job.status})", slug="job-finished")
    if not job.terminal:
        job = await jobs.cancel(job_id)
    return await job_status(jobs.store, job)
