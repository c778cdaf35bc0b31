"""When does this page run: a request's scheduling terms, resolved once.

Every request (a synchronous one in :class:`~ocrserve.service.OcrService`, a job's page in the job
worker) states what it asked for in a :class:`~ocrserve.work.WorkItem`; :func:`resolve` turns that
and the router's config into :class:`Terms` in one call, and nothing downstream derives or patches
them again:

* **lane**: the one the request named, else ``fast`` when small (at most ``fast.max_pages`` pages
  and ``fast.max_pixels`` normalized pixels), else ``bulk``;
* **order**: its place in the lane's queue (lower first, as vLLM's ``PriorityRequestQueue`` in
  ``vllm/v1/core/sched/request_queue.py`` orders ``(priority, arrival)``): its own priority (a
  job's, :meth:`~ocrserve.work.Priority.of_job`), else the lane's, one step later for a fast
  document above ``fast.urgent_pages`` pages, so single pages go first (shortest first, until the
  lane's ``aging_s``). The lane's queue (:mod:`ocrserve.policies`) is the only reader of it;
* **engine class**: :class:`~ocrserve.work.EngineClass` ``INTERACTIVE`` for the pages that may
  burst (below), ``BACKGROUND`` for the rest (the bulk lane's, and a fast document's above
  ``fast.urgent_pages`` pages): what the engine's stages, threads and recognition batches go by
  (with aging there, :mod:`ocrserve.engines.stage_scheduler`), and what vLLM gets as the request's
  ``priority``. A single page beside a flood of 4-page synchronous documents waited 18-19 s in
  the router and 5-7 s in recognition while the documents' pages ran as interactive as it did;
* **bursts**: whether it may use the fast lane's burst slots (a fast request of at most
  ``fast.urgent_pages`` pages), past the pages in the engine that may not;
* **deadline**: the client's (``timeout``, a job's ``deadline``), else the lane's ``timeout_s``
  from now (none when 0), and whether it was the client's: a lane's default deadline that passes
  is the server's doing, so a job's page is retried (:attr:`Terms.deadline_is_clients`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ocrserve.config import RouterConfig
from ocrserve.work import Deadline, EngineClass, Priority, WorkItem

FAST, BULK = "fast", "bulk"


@dataclass(frozen=True)
class Terms:
    """A request's resolved scheduling terms (see the module docstring).

    Attributes:
        lane: ``fast`` or ``bulk``.
        order: its pages' order in the lane's queue, lower first.
        engine_class: how the engine runs its pages.
        bursts: its pages may run in the fast lane's burst slots.
        deadline: when its pages must be done, or None.
        deadline_is_clients: the deadline was the client's own, not the lane's default.
        client: whom the request is for (``router.fair_by``); ``""``: one shared client.
        arrived: when the request arrived (``time.monotonic()``), or None (at admission).
    """

    lane: str
    order: Priority
    engine_class: EngineClass
    bursts: bool = False
    deadline: Deadline | None = None
    deadline_is_clients: bool = False
    client: str = ""
    arrived: float | None = None

    def since_arrival_s(self) -> float:
        """Seconds since the request arrived (its upload, inspection and previews); 0.0 where
        :attr:`arrived` is not known."""
        return time.monotonic() - self.arrived if self.arrived is not None else 0.0


def choose_lane(work: WorkItem, cfg: RouterConfig, pages: int, pixels: int) -> str:
    """The lane of a request of ``pages`` pages and ``pixels`` normalized pixels: the one ``work``
    names, else ``fast`` when small (``fast.max_pages``, ``fast.max_pixels``), else ``bulk``."""
    if work.lane is not None:
        return work.lane
    return FAST if pages <= cfg.fast.max_pages and pixels <= cfg.fast.max_pixels else BULK


def resolve(work: WorkItem, cfg: RouterConfig, pages: int, pixels: int = 0) -> Terms:
    """The terms of a request of ``pages`` pages and ``pixels`` normalized pixels (module docstring).

    The lane's default deadline runs from this call: resolve at admission.
    """
    lane = choose_lane(work, cfg, pages, pixels)
    lane_cfg = cfg.fast if lane == FAST else cfg.bulk
    document = lane == FAST and pages > cfg.fast.urgent_pages
    bursts = lane == FAST and not document
    order = work.priority if work.priority is not None else Priority(lane_cfg.priority + document)
    deadline = work.deadline
    if deadline is None and lane_cfg.timeout_s:
        deadline = Deadline.after(lane_cfg.timeout_s)
    return Terms(
        lane=lane,
        order=Priority(order),
        engine_class=EngineClass.INTERACTIVE if bursts else EngineClass.BACKGROUND,
        bursts=bursts,
        deadline=deadline,
        deadline_is_clients=work.deadline is not None,
        client=work.client,
        arrived=work.arrived,
    )


def inspection_class(work: WorkItem) -> EngineClass:
    """The class a request's document is inspected at, before its lane is chosen: its named
    lane's, else interactive (inspection is short, and decides the lane)."""
    return EngineClass.BACKGROUND if work.lane == BULK else EngineClass.INTERACTIVE


def may_dispatch(
    terms: Terms, in_flight: int, limit: int, burst_slots: int, saturated: bool, unburstable_in_engine: int
) -> bool:
    """Whether a queued page may go to the engine now: ``in_flight`` pages are there of ``limit``
    (the router's slots). A page whose terms may burst may also take one of ``burst_slots`` beyond
    them, and even while the engine reports itself ``saturated`` (its own queue backed up: other
    pages then wait in the router, where lanes order them), but only while pages that may not
    burst (the bulk lane's, a fast document's) hold ``unburstable_in_engine`` > 0 of the slots:
    the burst is for overtaking their pages, and single pages that burst into every slot that
    frees would leave none for the others' share."""
    burst = burst_slots if terms.bursts and unburstable_in_engine > 0 else 0
    if in_flight >= limit + burst:
        return False
    return burst > 0 or not saturated
