"""HTTP endpoints: OCR, health, readiness, models, metrics."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Depends, File, Request, UploadFile
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ocrserve.api.auth import client_of, require_api_key
from ocrserve.api.disconnect import until_disconnect
from ocrserve.api.jobs import accept_job
from ocrserve.api.params import IdempotencyKey, OcrParams, PreferHeader, ocr_params, prefers_async, render
from ocrserve.api.problems import PROBLEM_JSON
from ocrserve.api.schemas import OcrResult
from ocrserve.api.schemas import Problem as ProblemSchema
from ocrserve.api.uploads import RAW_BODY_OPENAPI, UploadRoute, document_file, form_limits, job_uploads
from ocrserve.engines.base import Unready
from ocrserve.errors import DeadlinePassed, EngineUnavailable

api = APIRouter(dependencies=[Depends(require_api_key)], route_class=UploadRoute)
ops = APIRouter()

_problem_docs = {
    code: {"model": ProblemSchema, "content": {PROBLEM_JSON: {}}, "description": what}
    for code, what in {
        400: "bad parameter",
        401: "no API key",
        403: "bad API key",
        413: "too many bytes, pixels or pages",
        415: "unsupported or undecodable file",
        422: "the document exhausts or kills its decoding process (memory or time limit)",
        429: "the key's rate limit, or the address's failed authentications; see Retry-After",
        503: "engine still loading or down (every vLLM replica), lane full, the timeout too short for the work "
        "ahead (deadline-unmeetable), a fast request without timeout over the lane's latency target "
        "(latency-target), a single page that would make requests admitted before it late (engine-promised), "
        "or (Prefer: respond-async) the job store failing; see Retry-After",
        504: "deadline passed",
        507: "(Prefer: respond-async) the data folder is full: the job cannot be kept",
    }.items()
}


def require_ready(request: Request) -> None:
    """Raise 503 with ``Retry-After`` unless the engine takes pages now.

    The detail tells apart an engine that failed to start (``Retry-After: 60``), one still loading
    (loading, warming up, or none of its vLLM replicas up yet), and one that was ready and is down
    (every vLLM replica down: which, since when, why); the last two with the engine's
    ``Retry-After`` (a vLLM replica's poll interval). Jobs are not refused for any of this: their
    pages wait in the queue for the engine.

    Raises:
        EngineUnavailable: the engine takes no pages now.
    """
    state = request.app.state
    if state.engine_error:
        raise EngineUnavailable(f"the OCR engine failed to start: {state.engine_error}", headers={"Retry-After": "60"})
    engine = state.engine
    if state.warm and engine.ready:
        return
    why = engine.unready() or Unready(loading=True)  # None: ready, but still warming up (calibration)
    headers = {"Retry-After": str(why.retry_after_s)}
    if not why.loading:
        raise EngineUnavailable(f"the OCR engine is down: {why.detail}", slug="engine-down", headers=headers)
    raise EngineUnavailable(
        "the OCR engine is still loading" + (f": {why.detail}" if why.detail else ""), headers=headers
    )


@api.post(
    "/v1/ocr",
    summary="OCR one document synchronously",
    responses={
        200: {"model": OcrResult},
        202: {"description": "Prefer: respond-async: a job (see POST /v1/jobs)"},
        **_problem_docs,
    },
    openapi_extra=RAW_BODY_OPENAPI,
)
@form_limits(lambda config: (1, "1 file per request (POST /v1/jobs takes several)"))
async def ocr(
    request: Request,
    params: Annotated[OcrParams, Depends(ocr_params)],
    file: Annotated[UploadFile | None, File(description="the document (or send it as the raw body)")] = None,
    prefer: PreferHeader = None,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """OCR one document (image, multi-page TIFF or PDF) and return its text with line boxes.

    Send multipart/form-data with a ``file`` field, or the file itself as the body with its
    image/*, application/pdf or application/octet-stream type. Optional ``pages`` (``1-3,5``),
    ``timeout`` (seconds; 504 when not done by then), ``format`` (``json``, ``text``,
    ``markdown``) and ``priority`` (``interactive`` forces the fast lane, ``bulk`` the bulk lane)
    as form fields or query parameters (the only way with a raw body).

    ``X-Cache: hit`` when the answer came from the dedup cache. With ``Prefer: respond-async`` the
    document becomes a job instead (checked for the same mistakes first): 202 with
    ``Location: /v1/jobs/{id}`` (see ``POST /v1/jobs``); ``timeout``, ``webhook_url``, ``filename``
    and ``Idempotency-Key`` apply to it, and ``priority`` is then the job's (0 to
    ``jobs.max_priority``, higher first).
    """
    if prefers_async(prefer):
        uploads = await job_uploads(request, [file] if file else None, params.filename)
        return await accept_job(request, uploads, params.as_job(), idempotency_key, respond_async=True)
    require_ready(request)
    document = await document_file(request, file)
    client = client_of(request, request.app.state.config.router.fair_by)
    item = replace(params.work_item(request.state.arrived), client=client)
    work = request.app.state.service.ocr(document, pages=params.pages, work=item)
    try:
        result, cached = await until_disconnect(request, work)
    except DeadlinePassed as late:
        if params.timeout is None:  # the lane's own deadline (router.<lane>.timeout_s)
            raise
        raise DeadlinePassed(
            f"the document was not done within timeout={params.timeout:g} s ({late.detail})",
            slug=late.slug,
            headers=late.headers,
        ) from None
    finally:
        document.close()
    response = render(result, params.format)
    response.headers["X-Cache"] = "hit" if cached else "miss"
    return response


@api.get("/v1/models", summary="The engine's model and limits")
async def models(request: Request) -> dict:
    """The served model with its engine kind, readiness, slots and the preprocessor's limits (the
    ``transformers`` engine adds its device, dtype and parameter count)."""
    cfg = request.app.state.config
    limits = {
        "max_upload_mb": cfg.server.max_upload_mb,
        "max_pages": cfg.preprocess.max_pages,
        "max_document_pages": cfg.preprocess.max_document_pages,
        "max_page_pixels": cfg.preprocess.max_page_pixels,
        "min_pixels": cfg.preprocess.min_pixels,
        "max_pixels": cfg.preprocess.max_pixels,
        "factor": cfg.preprocess.factor,
    }
    entry = {"engine": cfg.engine.kind} | request.app.state.engine.describe() | {"limits": limits}
    return {"object": "list", "data": [entry]}


@ops.get("/healthz", summary="Liveness")
async def healthz() -> dict:
    """200 while the process serves HTTP."""
    return {"status": "ok"}


@ops.get(
    "/readyz",
    summary="Readiness",
    responses={503: {**_problem_docs[503], "description": "engine not ready, or the job store failing"}},
)
async def readyz(request: Request) -> dict:
    """200 once the engine is loaded and warmed up and the job store takes writes (checked every
    ``store.probe_interval_s``), with the vLLM engine's ``replicas`` (each one's ``up``, ``since``,
    ``reason``, as in ``/v1/models``); 503 before, while every vLLM replica is down, if loading
    failed, or while the store fails (read-only, I/O errors, full, unreachable), with ``Retry-After``.
    A full data folder does not make it 503: synchronous OCR still works; job submissions get 507."""
    error = request.app.state.engine_error
    if error:
        raise EngineUnavailable(f"the OCR engine failed to start: {error}")
    require_ready(request)
    request.app.state.jobs.health.require_store()
    engine = request.app.state.engine.describe()
    return {"status": "ready", "model": engine["id"]} | {k: engine[k] for k in ("replicas",) if k in engine}


@ops.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
async def prometheus_metrics() -> Response:
    """Prometheus text exposition format."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
