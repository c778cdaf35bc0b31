"""The one path of a page from the preprocessor to its result, for synchronous requests and jobs alike.

:class:`PagePipeline` takes a decoded page (or the preprocessor's :class:`DecodeFailure` for it),
submits it to the router under its request's :class:`~ocrserve.scheduling.Terms`, and returns an
:class:`Attempt`: the page's result with its timings, or the problem it failed with and whether
retrying may help. Every page is timed the same way on both paths, every failure maps to the same
problem, and every page is counted once in ``ocrserve_pages_total``, when its outcome is final
(:meth:`PagePipeline.count_final`: at once for a synchronous request, after the last try for a job).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from ocrserve import metrics
from ocrserve.engines.base import PageError
from ocrserve.errors import DeadlinePassed, EngineFailed, EngineRefused, EngineUnavailable, ProblemError
from ocrserve.pages import Page, PageResult
from ocrserve.preprocess import DecodeFailure, Preprocessor
from ocrserve.router import Reservation, Router
from ocrserve.scheduling import Terms
from ocrserve.work import EngineClass

#: Seconds a client is told to wait after a transient engine failure (a vLLM restart takes longer
#: than a blip; the client's own backoff grows from there).
TRANSIENT_RETRY_AFTER_S = 5


@dataclass
class Attempt:
    """How one try of a page ended.

    Attributes:
        result: the page's result; on failure an entry with no text and the problem as ``error``.
        problem: why it failed, or None.
        transient: True when trying the page again may succeed (engine down or restarting, the
            lane's default deadline); False for the page's own fault or its request's deadline.
    """

    result: PageResult
    problem: ProblemError | None = None
    transient: bool = False

    @classmethod
    def failed(cls, index: int, problem: ProblemError, *, transient: bool = False) -> Attempt:
        """The attempt of page ``index`` that failed with ``problem``: its result entry has no text
        and the problem as ``error``."""
        return cls(PageResult(index=index, width=0, height=0, text="", error=problem.to_dict()), problem, transient)


def page_problem(index: int, error: PageError) -> ProblemError:
    """The problem of a page the engine failed: 503 with ``Retry-After`` when the failure is
    transient (engine down or restarting), 422 when the engine's server refused the page with a
    4xx (vLLM: more tokens than its ``max_model_len``), else 502."""
    if error.transient:
        return EngineUnavailable(f"page {index + 1}: {error}", headers={"Retry-After": str(TRANSIENT_RETRY_AFTER_S)})
    if error.status is not None and 400 <= error.status < 500:
        return EngineRefused(f"page {index + 1}: {error}")
    return EngineFailed(f"page {index + 1}: {error}")


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


async def attempt_page(
    page: Page | DecodeFailure, read: Callable[[Page], Awaitable[PageResult]], skipped: Callable[[], None]
) -> Attempt:
    """The steps of one page, the same in the gateway and in batch: a page that failed decoding
    fails with its problem, a page whose result is known (its PDF text layer, a blank page) is
    answered without the engine (``skipped()`` is called for both), and any other is read by
    ``read`` (the router, or batch's engine); an engine failure becomes its problem
    (:func:`page_problem`) and every result gets its timings (:func:`with_timings`).

    Raises:
        Exception: whatever ``read`` raises besides :class:`~ocrserve.engines.base.PageError`.
    """
    if isinstance(page, DecodeFailure):
        skipped()
        return Attempt.failed(page.index, page.problem)
    metrics.PREPROCESS_SECONDS.observe(page.preprocess_s)
    queued = time.perf_counter()
    if (known := page.known_result()) is not None:
        skipped()
        if known.source == "blank":
            metrics.BLANK_PAGES.inc()
        return Attempt(with_timings(known, page, queued))
    try:
        result = await read(page)
    except PageError as exc:
        return Attempt.failed(page.index, page_problem(page.index, exc), transient=exc.transient)
    metrics.ENGINE_SECONDS.observe(sum(result.timings.values()))
    return Attempt(with_timings(result, page, queued))


class PagePipeline:
    """Runs single pages through the router (see the module docstring).

    Args:
        router: admits and dispatches pages to the engine.
        preprocessor: counts the line units of a page that had no preview.
    """

    def __init__(self, router: Router, preprocessor: Preprocessor):
        self.router = router
        self.preprocessor = preprocessor

    async def run(
        self, page: Page | DecodeFailure, reservation: Reservation, terms: Terms, units: float | None = None
    ) -> Attempt:
        """One try of one page under ``terms`` (:func:`attempt_page`, through the router); the page
        takes one page of ``reservation``. ``units``: its line units counted on its preview
        (:mod:`ocrserve.preprocess.lines`); None: counted on the decoded page now.

        Raises:
            asyncio.CancelledError: its request went away (the page is dropped or aborted).
        """

        async def submit(page: Page) -> PageResult:
            page.line_units = units
            if units is None:
                [page.line_units] = await self.line_units([page.image], terms.engine_class)
            return await self.router.submit(page, reservation, terms)

        try:
            return await attempt_page(page, submit, skipped=lambda: reservation.release(1))
        except DeadlinePassed as problem:  # the lane's default deadline may pass on a calmer retry
            return Attempt.failed(page.index, problem, transient=not terms.deadline_is_clients)

    async def line_units(self, images: list[np.ndarray | None], engine_class: EngineClass) -> list[float | None]:
        """:meth:`~ocrserve.preprocess.Preprocessor.line_units` of ``images`` (pages, or a
        request's previews), the router's share clock told that the count takes a core from the
        engine's background pages meanwhile (:meth:`~ocrserve.servicetime.ShareClock.pre_empting`).
        A count waiting for one of the preprocessor's counting threads counts as running: there is
        a thread per core unless ``preprocess.workers`` says otherwise, and with more counts than
        cores none is left to those pages either way."""
        with self.router.clock.pre_empting():
            return await self.preprocessor.line_units(images, engine_class)

    @staticmethod
    def count_final(attempt: Attempt) -> None:
        """Count a page whose outcome is final (``ocrserve_pages_total{outcome="ok"|"failed"}``)."""
        metrics.PAGES.labels("ok" if attempt.problem is None else "failed").inc()
