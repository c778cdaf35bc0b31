"""Application factory: wires preprocessor, engine, router and routes into one FastAPI app."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from fastapi import FastAPI

from ocrserve import __version__, metrics
from ocrserve.alarm import within
from ocrserve.api import jobs, problems, routes, web
from ocrserve.api.auth import Gate, ProtectOps, ops_paths
from ocrserve.api.body_limits import BodyLimitMiddleware
from ocrserve.api.observe import MetricsMiddleware
from ocrserve.api.ratelimit import RateLimitHeaders
from ocrserve.api.requestid import RequestIdMiddleware
from ocrserve.config import Config
from ocrserve.engines import create_engine
from ocrserve.jobs.runtime import Jobs
from ocrserve.logs import redact_url
from ocrserve.preprocess import Preprocessor
from ocrserve.preprocess.synthetic import calibration_pages
from ocrserve.router import Router
from ocrserve.service import OcrService

log = logging.getLogger(__name__)
#: Seconds the calibration pages may take at start before the gateway serves without them.
CALIBRATION_S = 60.0


async def _warm_up(app: FastAPI) -> None:
    state = app.state
    try:
        await asyncio.gather(state.engine.start(), state.preprocessor.warm_up())
    except ValueError as exc:  # a checkpoint or setting the engine cannot use: the message says which
        log.error("engine failed to start: %s", exc)
        state.engine_error = f"{type(exc).__name__}: {exc}"
        return
    except Exception as exc:  # keep serving /healthz; /readyz reports the failure
        log.exception("engine failed to start")
        state.engine_error = f"{type(exc).__name__}: {exc}"
        return
    if state.config.router.calibrate:
        await _calibrate(state)
    state.warm = True
    metrics.ENGINE_READY.set(1)
    health = state.jobs.health
    if health.failing.holds:  # /readyz waits for the store too: so does the line that says ready
        log.warning("engine warm; /readyz answers 503 until the job store recovers (%s)", health.failing.reason)
        while health.failing.holds:
            await asyncio.sleep(state.config.store.probe_interval_s)
    _log_ready(state)


def _log_ready(state) -> None:
    """The one line that says the gateway is ready (``/readyz`` turns 200) and what it serves; in
    JSON lines its parts are fields too."""
    config: Config = state.config
    server, router = config.server, state.router
    url = f"http://{server.host}:{server.port}"
    lanes = (
        f"lanes (fast: up to {config.router.fast.max_pages} pages, queue {config.router.fast.queue_pages}; "
        f"bulk: queue {config.router.bulk.queue_pages})"
        if config.router.mode == "lanes"
        else f"one fifo queue of {config.router.bulk.queue_pages}"
    )
    store = state.jobs.store
    path = getattr(store, "path", None)
    where = (
        f"sqlite {path}"
        if path is not None
        else f"redis {redact_url(config.store.url)} (prefix {config.store.key_prefix})"
    )
    log.info(
        "ready on %s: profile %s, engine %s %s, %d slots (%d pages in flight), router %s, jobs in %s",
        url,
        config.profile,
        config.engine.kind,
        state.engine.model,
        state.engine.slots,
        router.capacity,
        lanes,
        where,
        extra={
            "url": url,
            "profile": config.profile,
            "engine": config.engine.kind,
            "model": state.engine.model,
            "slots": state.engine.slots,
            "in_flight": router.capacity,
            "router": config.router.mode,
            "store": where,
        },
    )


async def _calibrate(state) -> None:
    """Time the calibration pages (``router.calibrate``) where the engine answers now, within
    :data:`CALIBRATION_S`; best effort: without it admission starts from ``router.initial_page_s``
    and learns from clients' pages (an engine whose replicas are still starting is not waited for)."""
    if not state.engine.ready:
        log.info("calibration skipped: the engine is not ready yet")
        return
    try:
        await within(state.router.calibrate(calibration_pages(state.config.preprocess)), CALIBRATION_S)
    except Exception as exc:  # TimeoutError, PageError: serve anyway
        why = str(exc) or (f"no answer within {CALIBRATION_S:g} s" if isinstance(exc, TimeoutError) else repr(exc))
        log.warning("calibration skipped: %s", why)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    """Start the engine in the background (``/readyz`` turns 200 when warm) and the job system
    (store, worker, webhooks, janitor); stop them at exit, the job worker first."""
    config: Config = app.state.config
    state = app.state
    state.preprocessor = Preprocessor(config.preprocess)
    state.engine = create_engine(config)
    state.engine_error = None
    state.warm = False  # True once the engine is loaded, warmed up and timed (router.calibrate)
    state.router = Router(state.engine, config.router)
    state.router.start()
    state.jobs = Jobs(config, state.preprocessor, state.router)
    sync_cache = state.jobs.cache if config.store.cache_sync else None
    state.service = OcrService(config, state.preprocessor, state.router, cache=sync_cache)
    state.jobs.start()
    warm = asyncio.create_task(_warm_up(app))
    try:
        yield
    finally:
        warm.cancel()
        await state.jobs.close()
        await state.service.close()
        await state.router.close()
        metrics.ENGINE_READY.set(0)
        await state.engine.close()
        state.preprocessor.close()
        await state.gate.close()


class GatewayApp(FastAPI):
    """The gateway's FastAPI app, with :class:`~ocrserve.api.requestid.RequestIdMiddleware` around
    all of it, Starlette's error middleware included, so a 500 has its request id too."""

    def build_middleware_stack(self):
        """Starlette's middleware stack, inside the request id's."""
        return RequestIdMiddleware(super().build_middleware_stack())


def create_app(config: Config) -> FastAPI:
    """The gateway for ``config``; the engine loads when the app starts (ASGI lifespan)."""
    # python-multipart logs a WARNING per malformed part header: a client's fault, answered 400,
    # not the operator's news (a fuzzing run wrote 836 such lines in 12,246 requests).
    logging.getLogger("python_multipart").setLevel(logging.ERROR)
    app = GatewayApp(
        title="ocrserve",
        version=__version__,
        summary="Document OCR over REST: text with line boxes, per page.",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's pages load their scripts from a CDN: web.install serves both offline
        redoc_url=None,
    )
    app.state.config = config
    app.state.gate = Gate(config)
    problems.install(app)
    app.include_router(routes.api)
    app.include_router(jobs.api)
    app.include_router(routes.ops)
    web.install(app)
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=int(config.server.max_upload_mb * (1 << 20)),
        read_timeout_s=config.server.read_timeout_s,
    )
    if config.server.protect_ops:
        app.add_middleware(ProtectOps, paths=ops_paths(app))
    app.add_middleware(MetricsMiddleware)
    app.add_middleware(RateLimitHeaders)
    app.openapi = _without_validation_errors(app.openapi)
    return app


def _without_validation_errors(build: Callable[[], dict]) -> Callable[[], dict]:
    """FastAPI documents a 422 ``HTTPValidationError`` on every route with parameters; this gateway
    answers a bad parameter with a 400 problem instead (:mod:`ocrserve.api.problems`), which the
    routes document. ``build`` is FastAPI's own ``app.openapi``, which caches its schema."""

    def openapi() -> dict:
        schema = build()
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        return schema

    return openapi
