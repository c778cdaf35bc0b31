"""What every request hands the core: a :class:`WorkItem` with its :class:`Deadline` and :class:`Priority`.

The edge (the REST handler of a synchronous request, the job worker for a job's page) builds one
work item; :func:`ocrserve.scheduling.resolve` turns it into the request's scheduling terms, which
the router, the engine and the page pipeline read. There is one
convention for priority, vLLM's: **lower runs sooner** (vLLM's ``PriorityRequestQueue`` in
``vllm/v1/core/sched/request_queue.py`` orders requests by ``(priority, arrival_time)``).

How the public ``priority`` fields map onto it:

==========================================  ==============================================
public field                                 work item
==========================================  ==============================================
``POST /v1/ocr`` ``priority=interactive``    ``lane="fast"``: the fast lane's priority
                                             (``router.fast.priority``, 0)
``POST /v1/ocr`` ``priority=bulk``           ``lane="bulk"``: the bulk lane's priority
                                             (``router.bulk.priority``, 10)
``POST /v1/ocr`` without ``priority``        the lane by size, and that lane's priority
job ``priority`` p in 0..``jobs.max_priority``  ``lane="bulk"``, :meth:`Priority.of_job`:
  (higher runs first)                        ``router.bulk.priority + jobs.max_priority - p``
==========================================  ==============================================

So with the defaults a synchronous bulk request (10) queues with a job of the highest priority
(9 -> 10) and before any other job (0 -> 19). The priority orders a lane's queue only; the engine
goes by the page's :class:`EngineClass` (:mod:`ocrserve.scheduling`: interactive for the fast
lane, background for the bulk lane).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

#: Priorities at or below this are interactive (the fast lane's default is 0).
URGENT = 0


class EngineClass(enum.IntEnum):
    """How the engine runs a page (:func:`ocrserve.scheduling.resolve`): ``INTERACTIVE`` (the fast
    lane) on full-speed sessions and threads, ahead of ``BACKGROUND`` pages (the bulk lane) at
    every stage until those have waited the engine's aging time. An ``int`` (0, 1), so that it is
    also the per-request ``priority`` vLLM gets and passes :func:`is_urgent` as it should."""

    INTERACTIVE = URGENT
    BACKGROUND = URGENT + 1

    @classmethod
    def of(cls, priority: int) -> EngineClass:
        """The class of a raw ``priority`` (a client's own, as the protocol stand-in receives it):
        interactive at or below :data:`URGENT`, else background."""
        return cls.INTERACTIVE if is_urgent(priority) else cls.BACKGROUND


class Priority(int):
    """A scheduling priority: an ``int``, lower runs sooner (see the module docstring)."""

    @classmethod
    def of_job(cls, job_priority: int, max_priority: int, bulk: int) -> Priority:
        """The priority of a job's pages.

        Args:
            job_priority: the job's public priority, 0..``max_priority``, higher runs first.
            max_priority: ``jobs.max_priority``.
            bulk: the bulk lane's priority (``router.bulk.priority``), which the most urgent job gets.
        """
        return cls(bulk + max_priority - job_priority)


def is_urgent(priority: int) -> bool:
    """Whether ``priority`` is interactive work (at or below :data:`URGENT`), which the embedded
    engine runs on its full-speed sessions and threads; every larger value is background work."""
    return priority <= URGENT


@dataclass(frozen=True)
class Deadline:
    """The instant a page must be done by, on the ``time.monotonic()`` clock of this process.

    The router enforces it on the pages it holds: a page still queued at its deadline is dropped
    before the engine (504); a page running in the engine then is cancelled there (vLLM aborts a
    request whose connection closes; the embedded engine drops the page's remaining stages).
    Before a page reaches the router, decoding stops at it (``OcrService``) and a job's page is not
    started past it (the job worker); the vLLM engine's request timeout is the time left.
    """

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        """The deadline ``seconds`` from now."""
        return cls(time.monotonic() + seconds)

    @classmethod
    def at_unix(cls, unix_s: float) -> Deadline:
        """The deadline at Unix time ``unix_s`` (as stored with a job, which outlives processes)."""
        return cls(time.monotonic() + unix_s - time.time())

    def left(self) -> float:
        """Seconds until the deadline; 0 once it has passed."""
        return max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        """True once the deadline has passed."""
        return time.monotonic() >= self.at


@dataclass(frozen=True)
class WorkItem:
    """One request's scheduling terms, fixed at the edge.

    Attributes:
        deadline: when its pages must be done, or None for the lane's default
            (``router.<lane>.timeout_s``; none when that is 0).
        priority: the order of its pages in their lane's queue, or None for the lane's own
            priority.
        lane: ``fast`` or ``bulk`` when the client chose, or None to choose by size
            (``router.fast.max_pages``, ``router.fast.max_pixels``).
        client: whom the request is for (``router.fair_by``); its lane shares the engine between
            clients. ``""``: one shared client.
        arrived: when the request arrived (``time.monotonic()``), or None where it is admitted
            as it comes (a job's page).
    """

    deadline: Deadline | None = None
    priority: Priority | None = None
    lane: str | None = None
    client: str = ""
    arrived: float | None = None
