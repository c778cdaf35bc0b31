"""The interface every OCR engine implements.

An engine takes normalized pages (:class:`ocrserve.pages.Page`) and returns one
:class:`~ocrserve.pages.PageResult` per page, or raises :class:`PageError` for that page alone.
It declares ``slots``: how many pages it can usefully work on at once, which the dispatcher
uses for admission control. ``ready`` turns true once models are loaded and warmed.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from ocrserve.pages import Page, PageResult
from ocrserve.work import Deadline


class PageError(Exception):
    """One page failed in the engine.

    Attributes:
        transient: True when retrying may succeed (engine down, timeout); False when the page
            itself is at fault (undecodable, too large for the model).
        status: the HTTP status an engine server answered for the page, when it answered one
            (vLLM's 400 for a page over its ``max_model_len``); None otherwise.
    """

    def __init__(self, message: str, *, transient: bool = False, status: int | None = None):
        super().__init__(message)
        self.transient = transient
        self.status = status


#: ``Retry-After`` (seconds) of a 503 while an engine is not ready, unless it knows better.
NOT_READY_RETRY_AFTER_S = 5


@dataclass(frozen=True)
class Unready:
    """Why an engine takes no pages now (:meth:`Engine.unready`).

    Attributes:
        loading: True while it has never been ready (loading, warming up, waiting for its first
            replica); False when it was ready and is not any more (every replica down).
        detail: what it waits for, naming the parts at fault ("" when there is nothing to add).
        retry_after_s: seconds a client should wait before trying again (``Retry-After``).
    """

    loading: bool
    detail: str = ""
    retry_after_s: int = NOT_READY_RETRY_AFTER_S


class Engine(abc.ABC):
    """An OCR engine: async, page-granular, with a declared number of slots.

    Subclasses implement :meth:`start`, :meth:`close` and :meth:`ocr_page`.
    """

    #: Model id reported in results and ``/v1/models``.
    model: str = ""

    def __init__(self) -> None:
        self.ready = False

    @property
    @abc.abstractmethod
    def slots(self) -> int:
        """Pages the engine can work on at once without queueing internally."""

    @property
    def background_apart(self) -> bool:
        """Whether background pages run on sessions of their own, at another speed than
        interactive ones (the embedded engine: one thread a stage, so a page alone there takes
        about twice as long); admission then times its calibration pages in both classes
        (:meth:`~ocrserve.router.Router.calibrate`). False here: the class is a priority only."""
        return False

    @abc.abstractmethod
    async def start(self) -> None:
        """Load models and warm up; sets ``ready``. Raises on a model that cannot load."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release threads, sessions and connections."""

    @abc.abstractmethod
    async def ocr_page(self, page: Page, *, priority: int = 0, deadline: Deadline | None = None) -> PageResult:
        """OCR one page; boxes in the page's client pixels.

        Cancelling the call aborts the page where the engine can (the router cancels a page whose
        deadline passed or whose request went away): vLLM aborts a request whose connection
        closes, the embedded engine drops the page's remaining stages.

        Args:
            page: a normalized page.
            priority: lower runs first where the engine can reorder (vLLM's ``priority``).
            deadline: when the page's request stops waiting, or None; an engine may bound its own
                waits by it (the vLLM engine's request timeout is the time left).

        Raises:
            PageError: this page failed; other pages are unaffected.
        """

    async def calibration_page(self, page: Page, *, priority: int = 0, max_tokens: int) -> PageResult:
        """OCR a synthetic calibration page (``router.calibrate``) whose reply ends within
        ``max_tokens`` output tokens where the engine generates; by default :meth:`ocr_page` (the
        embedded engine generates nothing). Its seconds teach admission, so it is never retried.

        Raises:
            PageError: as :meth:`ocr_page`.
        """
        return await self.ocr_page(page, priority=priority)

    async def ocr_pages(self, pages: Sequence[Page], *, priority: int = 0) -> list[PageResult | PageError]:
        """OCR several pages concurrently; each entry is a result or that page's error."""
        outcomes = await asyncio.gather(*(self.ocr_page(p, priority=priority) for p in pages), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, PageError):
                raise outcome
        return list(outcomes)

    def input_pixels(self, height: int, width: int) -> int:
        """Pixels the engine reads for a normalized page of ``height x width`` px: by default the
        page's own (a VLM's visual tokens grow with them); an engine that resizes pages for its
        model says how (the embedded engine's detector magnifies a narrow strip). Admission prices
        a page by them (:mod:`ocrserve.servicetime`)."""
        return height * width

    def saturated(self) -> bool:
        """True while the engine's own queue is backed up and new pages should wait in the router.

        The embedded engine never is (the router's slots bound it); the vLLM engine is when vLLM
        reports requests waiting or a nearly full KV cache.
        """
        return False

    def queued_inside(self) -> tuple[float, float | None]:
        """Work queued inside the engine by others, ahead of any page the router sends now:
        (requests, seconds until the engine has started them all, or None where it cannot tell).

        The embedded engine queues nothing of its own (the router owns all its slots): (0, None).
        The vLLM engine reports other clients' requests waiting in vLLM, priced by how long
        vLLM's requests ran of late.
        """
        return 0.0, None

    def others_inside(self) -> float:
        """Requests others have in the engine, waiting or running: none in the embedded engine (the
        router owns all its slots); the vLLM engine counts other clients' requests in vLLM."""
        return 0.0

    def unready(self) -> Unready | None:
        """Why the engine takes no pages now, or None while it is ``ready``. An embedded engine is
        only ever loading; the vLLM engine names its replicas and how long each has been down."""
        return None if self.ready else Unready(loading=True)

    def describe(self) -> dict:
        """The engine's model and limits, as ``GET /v1/models`` reports them."""
        return {"id": self.model, "object": "model", "slots": self.slots, "ready": self.ready}
