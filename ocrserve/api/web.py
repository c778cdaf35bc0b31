"""The web page and what it needs besides the OCR API.

- ``GET /``: one page (``static/index.html``, ``app.js``, ``app.css``: plain files, no build) to
  upload documents, see each page's lines over its image, and watch the lanes. It and its files
  need no API key; the page sends the key it is given (kept in the tab's ``sessionStorage``).
- ``GET /v1/stats``: the JSON the page polls: per-lane queues, the engine's slots in use, pages/s
  and p95 over the last minute, jobs queued and running.
- ``POST /v1/preview``: one page of a document as a JPEG, decoded as the engine sees it, for the
  formats a browser cannot show itself (TIFF, PDF); the page draws the lines' boxes over it.
- ``/docs`` and ``/redoc``: FastAPI's Swagger UI and ReDoc pages with their scripts served from
  the ``fastapi-offline`` package rather than a CDN, so that the documentation, like the page,
  works offline.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from pathlib import Path
from typing import Annotated

import fastapi_offline
import numpy as np
from fastapi import APIRouter, Depends, FastAPI, File, Query, Request, UploadFile
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from PIL import Image
from pydantic import BaseModel, Field

from ocrserve.api.auth import require_api_key
from ocrserve.api.routes import _problem_docs
from ocrserve.api.uploads import RAW_BODY_OPENAPI, UploadRoute, document_file, form_limits
from ocrserve.errors import BadRequest
from ocrserve.jobs.runtime import Jobs
from ocrserve.preprocess import DecodeFailure
from ocrserve.router import DRAIN_WINDOW_S, Router
from ocrserve.scheduling import FAST
from ocrserve.service import staged
from ocrserve.work import EngineClass

#: The page's files (package data).
STATIC_DIR = Path(__file__).with_name("static")
#: Swagger UI's and ReDoc's scripts, style and icon (``fastapi-offline``'s package data).
DOCS_ASSETS_DIR = Path(fastapi_offline.__file__).with_name("static")
#: The URL prefixes of the page's files and of the documentation's.
STATIC_URL, DOCS_ASSETS_URL = "/static", "/docs-assets"
#: Where the documentation is (FastAPI's own pages would load their scripts from a CDN).
DOCS_URL, REDOC_URL = "/docs", "/redoc"
#: The latency quantile ``GET /v1/stats`` reports.
LATENCY_QUANTILE = 0.95
#: JPEG quality of ``POST /v1/preview``'s images: text stays sharp at a fraction of PNG's bytes.
PREVIEW_QUALITY = 85

api = APIRouter(dependencies=[Depends(require_api_key)], tags=["web"], route_class=UploadRoute)
site = APIRouter(include_in_schema=False)


class LaneStats(BaseModel):
    """One lane now, and over the last minute."""

    queued_pages: int = Field(description="pages admitted and not yet in the engine")
    queued_cost: int = Field(description="their cost: pages, or visual tokens (cost_unit)")
    queue_pages: int = Field(description="the most pages the lane holds (router.<lane>.queue_pages)")
    requests: int = Field(description="requests admitted and not yet finished")
    in_engine: int = Field(description="the lane's pages in the engine now")
    pages_per_s: float = Field(description="pages finished per second over the last window_s")
    p95_s: float | None = Field(
        description="95th percentile of a page's seconds from its lane's queue to done, over the last window_s; "
        "null when none finished"
    )
    predicted_s: float = Field(
        description="seconds a one-page request of the average page's work (pixels the engine reads, its line "
        "units of text) admitted now would take, as admission reckons it: the work ahead of it times upper_factor, "
        "and its own"
    )


class EngineStats(BaseModel):
    """The engine's slots."""

    model: str
    ready: bool
    slots: int = Field(description="pages the engine works on at once")
    limit: int = Field(
        description="pages the router keeps in the engine at most now (router.slot_overcommit, router.concurrency)"
    )
    in_use: int = Field(description="pages in the engine now")


class JobStats(BaseModel):
    """Durable jobs of every tenant, in the job store that this gateway shares with any others."""

    queued: int = Field(description="jobs none of whose pages has been claimed yet")
    running: int = Field(description="jobs started and not ended")
    backlog_pages: int = Field(description="their pages waiting to be claimed or running")


class Stats(BaseModel):
    """``GET /v1/stats``: what the web page's lanes panel shows."""

    window_s: float = Field(description="seconds the rates and latencies are measured over")
    cost_unit: str = Field(description="router.cost: what queued_cost counts (pages or visual_tokens)")
    fast_max_pages: int = Field(
        description="router.fast.max_pages: synchronous requests of at most this many pages take the fast lane"
    )
    lanes: dict[str, LaneStats] = Field(description="by lane: fast and bulk")
    upper_factor: float = Field(
        description="what admission multiplies the work ahead of a request by: a high quantile of how far pages "
        "ran over their prediction (at least 1.5 before the first was measured, narrowing to 1 by the 16th), or "
        "the pages in the engine's median over-run"
    )
    fast_latency_target_s: float | None = Field(
        description="the fast lane's latency target for a one-page request without timeout "
        "(router.fast.latency_target_s); null when it has none"
    )
    fast_latency_headroom_s: float = Field(
        description="seconds admission leaves free below that target: the 0.95 quantile of how far the last "
        "requests held to it finished past the bound they were admitted on (0 until 16 have)"
    )
    engine: EngineStats
    jobs: JobStats | None = Field(description="null while the job store does not answer")


#: The problems of an upload, as ``POST /v1/ocr`` documents them.
_problems = {code: _problem_docs[code] for code in (400, 401, 403, 413, 415, 422, 429)}


@api.get("/v1/stats", summary="Lanes, engine slots and jobs now", responses={k: _problems[k] for k in (401, 403, 429)})
async def stats(request: Request) -> Stats:
    """Per lane: pages queued and their cost, requests, pages in the engine, pages/s and p95
    seconds from queue to done over the last minute; the engine's slots in use; jobs queued and
    running in the job store. What the web page (``GET /``) polls."""
    state = request.app.state
    router: Router = state.router
    now = time.monotonic()
    factor = router.upper_factor()
    page = router.mean_work  # one page's: a moving average of pages
    lanes = {}
    for name, lane in router.lanes.items():
        p95 = lane.latency_quantile(now, LATENCY_QUANTILE)
        lanes[name] = LaneStats(
            queued_pages=lane.reserved,
            queued_cost=lane.queued_cost,
            queue_pages=lane.cfg.queue_pages,
            requests=lane.requests,
            in_engine=lane.in_flight,
            pages_per_s=round(lane.drain_rate(now), 3),
            p95_s=None if p95 is None else round(p95, 3),
            predicted_s=round(router.bound_s(lane, page, bursts=name == FAST and router.bursts), 3),
        )
    engine = EngineStats(
        model=state.engine.model,
        ready=bool(state.warm and state.engine.ready),
        slots=state.engine.slots,
        limit=router.limit,
        in_use=router.in_flight,
    )
    return Stats(
        window_s=DRAIN_WINDOW_S,
        cost_unit=router.cfg.cost,
        fast_max_pages=router.cfg.fast.max_pages,
        lanes=lanes,
        upper_factor=round(factor, 3),
        fast_latency_target_s=round(router.latency_target_s(page), 3) if router.has_latency_target else None,
        fast_latency_headroom_s=round(router.latency_headroom_s(), 3),
        engine=engine,
        jobs=await _job_stats(state.jobs),
    )


async def _job_stats(jobs: Jobs) -> JobStats | None:
    """The store's open jobs and backlog; None (the fault reported to its health) while it fails."""
    try:
        counts = await jobs.store.open_jobs()
        backlog = await jobs.store.backlog()
    except Exception as exc:
        if not jobs.health.report(exc):
            raise
        return None
    return JobStats(queued=counts["queued"], running=counts["running"], backlog_pages=backlog)


@api.post(
    "/v1/preview",
    summary="One page of a document as an image",
    response_class=Response,
    responses={200: {"content": {"image/jpeg": {}}, "description": "the page, as the engine sees it"}, **_problems},
    openapi_extra=RAW_BODY_OPENAPI,
)
@form_limits(lambda config: (1, "1 file per request"))
async def preview(
    request: Request,
    page: Annotated[int, Query(ge=1, le=2**31, description="1-based page number")] = 1,
    file: Annotated[UploadFile | None, File(description="the document (or send it as the raw body)")] = None,
) -> Response:
    """Page ``page`` of the document (multipart ``file``, or the raw body) as a JPEG, decoded and
    sized as for OCR: upright, within the pixel budget, PDFs rendered at ``preprocess.pdf_dpi``.
    Line boxes, which are in the page's own pixels (its ``width`` x ``height`` in the result),
    map onto it by scaling. The web page uses it for what a browser cannot show itself (TIFF,
    PDF). It is decoded by the background decoding processes, so it never holds up OCR."""
    state = request.app.state
    cfg = state.config
    priority = EngineClass.BACKGROUND
    document = await document_file(request, file)
    try:
        async with staged(document) as (source, _):
            info = await state.preprocessor.inspect(source, priority)
            if page > info.page_count:
                raise BadRequest(f"page={page}: the document has {info.page_count} page(s)")
            indices = info.select(str(page), cfg.preprocess)
            chunks = state.preprocessor.pages(source, info, indices, priority)
            async with contextlib.aclosing(chunks):
                (decoded,) = await anext(chunks)
    finally:
        document.close()
    if isinstance(decoded, DecodeFailure):
        raise decoded.problem
    return Response(await _jpeg(decoded.image), media_type="image/jpeg")


async def _jpeg(pixels: np.ndarray) -> bytes:
    """An RGB array as JPEG bytes, encoded off the event loop."""

    def encode() -> bytes:
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, "JPEG", quality=PREVIEW_QUALITY)
        return out.getvalue()

    return await asyncio.to_thread(encode)


@site.get("/")
async def index() -> FileResponse:
    """The web page."""
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def _roots(request: Request) -> tuple[str, str]:
    """The app's OpenAPI schema URL and the documentation's assets URL, under the request's root path."""
    root = request.scope.get("root_path", "").rstrip("/")
    return root + request.app.openapi_url, root + DOCS_ASSETS_URL


@site.get(DOCS_URL)
async def swagger_ui(request: Request) -> HTMLResponse:
    """FastAPI's Swagger UI page, its script, style and icon served by this gateway."""
    schema, assets = _roots(request)
    return get_swagger_ui_html(
        openapi_url=schema,
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{assets}/swagger-ui-bundle.js",
        swagger_css_url=f"{assets}/swagger-ui.css",
        swagger_favicon_url=f"{assets}/favicon.png",
    )


@site.get(REDOC_URL)
async def redoc(request: Request) -> HTMLResponse:
    """FastAPI's ReDoc page, its script and icon served by this gateway (and no web fonts)."""
    schema, assets = _roots(request)
    return get_redoc_html(
        openapi_url=schema,
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{assets}/redoc.standalone.js",
        redoc_favicon_url=f"{assets}/favicon.png",
        with_google_fonts=False,
    )


def install(app: FastAPI) -> None:
    """Add the page, its files, ``/docs`` and ``/redoc`` with their files, ``/v1/stats`` and
    ``/v1/preview`` to ``app``, which was created with ``docs_url=None`` and ``redoc_url=None``."""
    app.include_router(api)
    app.include_router(site)
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="static")
    app.mount(DOCS_ASSETS_URL, StaticFiles(directory=DOCS_ASSETS_DIR), name="docs-assets")
    # FastAPI reads these only in its constructor (to add its own pages); ops_paths() reads them
    # to guard these pages with server.protect_ops.
    app.docs_url, app.redoc_url = DOCS_URL, REDOC_URL
