"""HTTP endpoints: OCR, health, readiness, models, metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ocrserve.api.auth import require_api_key
from ocrserve.api.problems import PROBLEM_JSON
from ocrserve.api.schemas import OcrResult
from ocrserve.api.schemas import Problem as ProblemSchema
from ocrserve.errors import BadRequest, ClientGone, DeadlinePassed, EngineUnavailable, UnsupportedMedia
from ocrserve.formats import FORMATS, MEDIA_TYPES, render_markdown, render_text

#: Largest ``timeout`` a request may ask for, seconds.
MAX_TIMEOUT_S = 3600.0
#: Media types accepted as a raw request body (besides multipart/form-data).
RAW_TYPES = ("image/", "application/pdf", "application/octet-stream")

api = APIRouter(dependencies=[Depends(require_api_key)])
ops = APIRouter()

_problem_docs = {
    code: {"model": ProblemSchema, "content": {PROBLEM_JSON: {}}, "description": what}
    for code, what in {
        400: "bad parameter", 401: "no API key", 403: "bad API key", 413: "too many bytes, pixels or pages",
        415: "unsupported or undecodable file", 503: "engine not ready", 504: "deadline passed",
    }.items()
}
_ocr_body = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object", "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "pages": {"type": "string", "example": "1-3,5"},
                        "timeout": {"type": "number", "description": "seconds"},
                        "format": {"type": "string", "enum": list(FORMATS)},
                        "priority": {"type": "string", "enum": ["interactive", "bulk"]},
                    },
                }
            },
            "image/*": {"schema": {"type": "string", "format": "binary"}},
            "application/pdf": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


async def read_upload(request: Request) -> tuple[bytes, dict[str, str]]:
    """The document bytes and the parameters (form fields, then query parameters).

    Raises:
        BadRequest: multipart without a ``file`` field.
        UnsupportedMedia: a body that is neither multipart nor an image/PDF media type.
    """
    params = dict(request.query_params)
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        form = await request.form(max_files=1, max_fields=16)
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise BadRequest("multipart field 'file' is required")
        params.update({k: v for k, v in form.items() if isinstance(v, str)})
        return await upload.read(), params
    if content_type and not content_type.startswith(RAW_TYPES):
        raise UnsupportedMedia(
            f"Content-Type {content_type!r}: send multipart/form-data with a 'file' field, or an image/* or "
            "application/pdf body"
        )
    return await request.body(), params


def parse_timeout(raw: str | None) -> float | None:
    """``timeout`` in seconds, or None. Raises BadRequest outside ``(0, MAX_TIMEOUT_S]``."""
    if raw in (None, ""):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"timeout={raw!r}: expected seconds as a number") from None
    if not 0 < value <= MAX_TIMEOUT_S:
        raise BadRequest(f"timeout={raw!r}: must be in (0, {MAX_TIMEOUT_S:g}] seconds")
    return value


def parse_format(raw: str | None) -> str:
    """``format`` (default json). Raises BadRequest for anything but json, text, markdown."""
    fmt = (raw or "json").lower()
    if fmt not in FORMATS:
        raise BadRequest(f"format={raw!r}: expected one of {', '.join(FORMATS)}")
    return fmt


def parse_priority(raw: str | None) -> str | None:
    """``priority``: ``interactive`` (fast lane), ``bulk``, or None (lane by size)."""
    if raw in (None, ""):
        return None
    if raw not in ("interactive", "bulk"):
        raise BadRequest(f"priority={raw!r}: expected interactive or bulk")
    return raw


def render(result: dict, fmt: str) -> Response:
    """The result in ``fmt``."""
    if fmt == "text":
        return PlainTextResponse(render_text(result), media_type=MEDIA_TYPES["text"])
    if fmt == "markdown":
        return Response(render_markdown(result), media_type=MEDIA_TYPES["markdown"])
    return JSONResponse(result)


def require_ready(request: Request) -> None:
    """Raise 503 with ``Retry-After`` while the engine is still loading."""
    if not request.app.state.engine.ready:
        raise EngineUnavailable("the OCR engine is still loading", headers={"Retry-After": "5"})


@api.post(
    "/v1/ocr", summary="OCR one document synchronously",
    responses={200: {"model": OcrResult}, **_problem_docs}, openapi_extra=_ocr_body,
)
async def ocr(request: Request) -> Response:
    """OCR one document (image, multi-page TIFF or PDF) and return its text with line boxes.

    Send multipart/form-data with a ``file`` field, or the file itself as the body with its
    image/* or application/pdf type. Optional ``pages`` (``1-3,5``), ``timeout`` (seconds),
    ``format`` (``json``, ``text``, ``markdown``) and ``priority`` (``interactive`` forces the fast
    lane, ``bulk`` the bulk lane) as form fields or query parameters.

    ``X-Cache: hit`` when the answer came from the dedup cache. With ``Prefer: respond-async`` the
    document becomes a job instead: 202 with ``Location: /v1/jobs/{id}`` (see ``POST /v1/jobs``).
    """
    if "respond-async" in request.headers.get("prefer", ""):
        from ocrserve.api.jobs import accept_job  # here, not at the top: ocrserve.api.jobs imports this module

        return await accept_job(request, sync_params=True)
    require_ready(request)
    data, params = await read_upload(request)
    timeout = parse_timeout(params.get("timeout"))
    fmt = parse_format(params.get("format"))
    priority = parse_priority(params.get("priority"))
    deadline = time.monotonic() + timeout if timeout else None
    work = request.app.state.service.ocr(data, pages=params.get("pages"), priority=priority, deadline=deadline)
    try:
        result, cached = await asyncio.wait_for(until_disconnect(request, work), timeout)
    except asyncio.TimeoutError:
        raise DeadlinePassed(f"the document was not done within timeout={timeout:g} s") from None
    response = render(result, fmt)
    response.headers["X-Cache"] = "hit" if cached else "miss"
    return response


async def until_disconnect(request: Request, work: Awaitable[tuple]) -> tuple:
    """Await ``work``, cancelling it (and so dropping its queued pages) if the client goes away.

    Raises:
        ClientGone: the client disconnected first.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task in done:
        return task.result()
    raise ClientGone("the client disconnected")


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


@api.get("/v1/models", summary="The engine's model and limits")
async def models(request: Request) -> dict:
    """The served model with its readiness, slots and the preprocessor's limits."""
    cfg = request.app.state.config
    entry = request.app.state.engine.describe() | {
        "limits": {
            "max_upload_mb": cfg.server.max_upload_mb,
            "max_pages": cfg.preprocess.max_pages,
            "max_page_pixels": cfg.preprocess.max_page_pixels,
            "min_pixels": cfg.preprocess.min_pixels,
            "max_pixels": cfg.preprocess.max_pixels,
            "factor": cfg.preprocess.factor,
        }
    }
    return {"object": "list", "data": [entry]}


@ops.get("/healthz", summary="Liveness")
async def healthz() -> dict:
    """200 while the process serves HTTP."""
    return {"status": "ok"}


@ops.get("/readyz", summary="Readiness", responses={503: _problem_docs[503]})
async def readyz(request: Request) -> dict:
    """200 once the engine is loaded and warmed up; 503 before (or if loading failed)."""
    error = request.app.state.engine_error
    if error:
        raise EngineUnavailable(f"the OCR engine failed to start: {error}")
    require_ready(request)
    return {"status": "ready", "model": request.app.state.engine.model}


@ops.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
async def prometheus_metrics() -> Response:
    """Prometheus text exposition format."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
