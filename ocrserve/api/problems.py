"""RFC 9457 problem-details responses for every error the gateway returns.

Every body carries the request's id as the extension member ``request_id`` (RFC 9457 section 3.2),
the value of its ``X-Request-ID`` response header, so that a client's report of an error leads to
the gateway's log lines about it.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ocrserve import metrics
from ocrserve.errors import PROBLEM_BASE, BadRequest, ClientGone, ProblemError, TooManyRequests
from ocrserve.logs import current_request_id
from ocrserve.store.health import FAULT_TYPES

log = logging.getLogger(__name__)
PROBLEM_JSON = "application/problem+json"


def with_request_id(body: dict) -> dict:
    """A problem body with the current request's ``request_id`` member (none outside a request)."""
    request_id = current_request_id()
    return {**body, "request_id": request_id} if request_id else body


def problem_body(problem: ProblemError) -> dict:
    """The problem-details body of ``problem`` for the current request (:func:`with_request_id`)."""
    return with_request_id(problem.to_dict())


def problem_response(problem: ProblemError) -> JSONResponse:
    """``application/problem+json`` response for ``problem``, with its extra headers; counted in
    ``ocrserve_problems_total``."""
    metrics.PROBLEMS.labels(problem.slug, str(problem.status)).inc()
    return JSONResponse(
        problem_body(problem), status_code=problem.status, headers=problem.headers, media_type=PROBLEM_JSON
    )


def _generic(status: int, title: str, detail: str, slug: str, headers: dict | None = None) -> JSONResponse:
    metrics.PROBLEMS.labels(slug, str(status)).inc()
    body = with_request_id({"type": PROBLEM_BASE + slug, "title": title, "status": status, "detail": detail})
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


async def _on_problem(request: Request, exc: ProblemError) -> JSONResponse:
    if exc.status == 413:
        count_too_large()
    elif isinstance(exc, TooManyRequests):  # refused before any lane: a rate limit or a tenant's quota
        metrics.REJECTIONS.labels("none", exc.slug.replace("-", "_")).inc()
    return problem_response(exc)


def count_too_large() -> None:
    """Count a 413 refusal; it happens before a lane is chosen, hence lane ``none``."""
    metrics.REJECTIONS.labels("none", "too_large").inc()


async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "HTTP error")
    return _generic(exc.status_code, title, str(exc.detail), title.lower().replace(" ", "-"), exc.headers)


#: Where FastAPI found a parameter (the first element of an error's ``loc``), as the client sent it.
_SENT_AS = {"body": "form field", "query": "query parameter", "header": "header", "path": "path", "cookie": "cookie"}


def describe_invalid(errors: list[dict]) -> str:
    """``timeout='abc' (form field): Input should be a valid number...; ...`` for FastAPI's
    validation errors of request parameters."""
    described = []
    for error in errors:
        where, *name = error.get("loc") or ("body",)
        field = ".".join(map(str, name)) or where
        given = f"={error['input']!r}" if isinstance(error.get("input"), (str, int, float)) else ""
        described.append(f"{field}{given} ({_SENT_AS.get(where, where)}): {error['msg']}")
    return "; ".join(described)


async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A malformed parameter (a ``timeout`` that is no number, an unknown ``format``, ...) is a 400
    problem naming it, as a parameter the handlers check themselves is (``BadRequest``)."""
    return problem_response(BadRequest(describe_invalid(exc.errors())))


async def _on_disconnect(request: Request, exc: ClientDisconnect) -> JSONResponse:
    log.info("client disconnected during the upload of %s %s", request.method, request.url.path)
    return problem_response(ClientGone("the client disconnected before its upload was complete"))


async def _on_storage_error(request: Request, exc: Exception) -> JSONResponse:
    """A storage fault (the job store or data folder failing under a job's status, result, events
    or cancel) is the store health's 503 or 507, logged once per outage; other errors of these
    types are a 500."""
    health = request.app.state.jobs.health
    if health.report(exc):
        return problem_response(health.refusal())
    return await _on_unexpected(request, exc)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _generic(500, "Internal error", f"{type(exc).__name__}: the server logged the details", "internal")


def install(app: FastAPI) -> None:
    """Register the problem-details handlers on ``app``."""
    app.add_exception_handler(ProblemError, _on_problem)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(ClientDisconnect, _on_disconnect)
    for kind in FAULT_TYPES:
        app.add_exception_handler(kind, _on_storage_error)
    app.add_exception_handler(Exception, _on_unexpected)
