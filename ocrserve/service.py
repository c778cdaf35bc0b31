"""Documents in, results out: inspect, pick a lane, decode pages, route them, assemble the result.

The result dict is the one DESIGN.md fixes (``id``, ``model``, ``lane``, ``text``, ``pages``,
``usage``). A page that fails carries an ``error`` problem object and empty text; its neighbours
are unaffected. A document whose every page failed raises the first page's problem.

With a dedup cache (``ocrserve.store.cache``), a document seen before with the same pages and model
is answered from the cache without engine work, and a document whose every page succeeded is
cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from ocrserve import metrics
from ocrserve.config import Config
from ocrserve.engines.base import PageError
from ocrserve.errors import DeadlinePassed, EngineFailed, EngineUnavailable, Problem
from ocrserve.store.cache import DedupCache, sha256_hex
from ocrserve.pages import Page, PageResult
from ocrserve.preprocess import PageFailure, Preprocessor, Source
from ocrserve.router import Reservation, Router

#: Seconds a client is told to wait after a transient engine failure (a vLLM restart takes longer
#: than a blip; the client's own backoff grows from there).
TRANSIENT_RETRY_AFTER_S = 5
#: Uploads above this many bytes reach the decoding processes as a temporary file, not as bytes
#: pickled once per chunk of pages.
SPOOL_BYTES = 1 << 20


@contextlib.contextmanager
def spooled(data: bytes) -> Iterator[Source]:
    """``data`` itself when small, else a temporary file holding it (removed on exit)."""
    if len(data) <= SPOOL_BYTES:
        yield data
        return
    with tempfile.NamedTemporaryFile(prefix="ocrserve-upload-") as fh:
        fh.write(data)
        fh.flush()
        yield Path(fh.name)


def failed_page(index: int, problem: Problem) -> PageResult:
    """The result entry of a page that failed: no text, the problem as ``error``."""
    return PageResult(index=index, width=0, height=0, text="", error=problem.to_dict())


def with_timings(result: PageResult, page: Page, queued: float) -> PageResult:
    """``result`` with ``queue_s``, ``preprocess_s`` and ``engine_s`` put before the engine's own stage
    timings (seconds); ``queued`` is the ``time.perf_counter()`` instant the page was submitted."""
    engine_s = sum(result.timings.values())
    result.timings = {
        "queue_s": round(max(0.0, time.perf_counter() - queued - engine_s), 4),
        "preprocess_s": round(page.preprocess_s, 4),
        "engine_s": round(engine_s, 4),
        **result.timings,
    }
    return result


def assemble_result(pages: list[dict], model: str, lane: str, seconds: float, result_id: str = "") -> dict:
    """The result dict of DESIGN.md from page dicts (``PageResult.to_dict()``) in order.

    Args:
        seconds: wall time of the whole document (``usage.seconds``).
        result_id: the result's ``id``; a new random one when empty.
    """
    failed = sum(1 for page in pages if page.get("error"))
    return {
        "id": result_id or uuid.uuid4().hex,
        "model": model,
        "lane": lane,
        "text": "\f".join(page["text"] for page in pages),
        "pages": pages,
        "usage": {"pages": len(pages) - failed, "seconds": round(seconds, 4)},
    }


def page_problem(index: int, error: PageError) -> Problem:
    """The problem of a page the engine failed: 503 with ``Retry-After`` when the failure is
    transient (engine down or restarting), else 502."""
    if error.transient:
        return EngineUnavailable(f"page {index + 1}: {error}", headers={"Retry-After": str(TRANSIENT_RETRY_AFTER_S)})
    return EngineFailed(f"page {index + 1}: {error}")


class OcrService:
    """Runs whole documents through preprocessor, router and engine.

    Args:
        config: the profile.
        preprocessor: decodes and normalizes pages.
        router: admits pages to lanes and dispatches them to the engine.
        cache: the dedup cache, or None for none.
    """

    def __init__(self, config: Config, preprocessor: Preprocessor, router: Router, cache: DedupCache | None = None):
        self.config = config
        self.preprocessor = preprocessor
        self.router = router
        self.cache = cache

    async def ocr(
        self, data: bytes, *, pages: str | None = None, priority: str | None = None, deadline: float | None = None
    ) -> tuple[dict, bool]:
        """OCR a document synchronously.

        Args:
            data: the uploaded file's bytes.
            pages: 1-based page ranges (``"1-3,5"``); all pages when omitted.
            priority: ``interactive`` forces the fast lane, ``bulk`` the bulk lane; else by size.
            deadline: ``time.monotonic()`` instant by which pages must have left the queue.

        Returns:
            ``(result, cached)``: the result dict (see module docstring), and whether it came from
            the dedup cache.

        Raises:
            Problem: 413/415 from the preprocessor, 400 for bad ``pages``, 503/429 when the lane is
                full, 504 when the deadline passed while queued, or every page's failure.
        """
        started = time.perf_counter()
        with spooled(data) as source:
            info = await self.preprocessor.inspect(source)
            indices = info.select(pages, self.config.preprocess)
            lane = self.router.lane_for(len(indices), info.normalized_pixels(indices, self.config.preprocess), priority)
            key = self.cache.key(await sha256_hex(data), indices) if self.cache else ""
            cached = await self.cache.get(key) if key else None
            if cached is not None:
                return assemble_result(cached, self.router.engine.model, lane, time.perf_counter() - started), True
            async with self.router.admit(lane, len(indices)) as reservation:
                outcomes = await self._run_pages(source, info, indices, reservation, deadline)
        problems = [problem for _, problem in outcomes if problem]
        if len(problems) == len(outcomes):
            raise problems[0]
        pages_out = [r.to_dict() for r, _ in outcomes]
        if key and not problems:
            await self.cache.put(key, pages_out)
        seconds = time.perf_counter() - started
        metrics.REQUEST_LATENCY_SECONDS.labels(lane).observe(seconds)
        return assemble_result(pages_out, self.router.engine.model, lane, seconds), False

    async def _run_pages(self, source, info, indices, reservation: Reservation, deadline) -> list:
        tasks: list[asyncio.Task] = []
        try:
            async for chunk in self.preprocessor.pages(source, info, indices):
                tasks.extend(asyncio.create_task(self._run_page(p, reservation, deadline)) for p in chunk)
            return await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _run_page(
        self, page: Page | PageFailure, reservation: Reservation, deadline: float | None
    ) -> tuple[PageResult, Problem | None]:
        if isinstance(page, PageFailure):
            metrics.PAGES.labels("failed").inc()
            reservation.release(1)
            return failed_page(page.index, page.problem), page.problem
        metrics.PREPROCESS_SECONDS.observe(page.preprocess_s)
        queued = time.perf_counter()
        try:
            result = await self.router.submit(page, reservation, deadline)
        except DeadlinePassed as problem:
            return failed_page(page.index, problem), problem
        except PageError as exc:
            metrics.PAGES.labels("failed").inc()
            problem = page_problem(page.index, exc)
            return failed_page(page.index, problem), problem
        metrics.ENGINE_SECONDS.observe(sum(result.timings.values()))
        metrics.PAGES.labels("ok").inc()
        return with_timings(result, page, queued), None
