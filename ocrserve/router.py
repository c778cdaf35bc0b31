"""Scheduling pages into the engine: lanes, admission control, backpressure, deadlines.

Every page reaches the engine through :class:`Router`. A request is first *admitted* to a lane
(:meth:`Router.admit`): the ``fast`` lane for small synchronous requests, the ``bulk`` lane for
everything else. Each lane's queue is bounded in pages; a request that does not fit is refused
at once with 503 (or 429) and a ``Retry-After`` computed by Little's law from the lane's queue and
its recent drain rate, so nothing is accepted that cannot be queued.

The dispatcher hands the engine's slots (``engine.slots x router.slot_overcommit``) to queued pages
in the order of the scheduling policy (:mod:`ocrserve.policies`: lanes with deficit round robin,
or one FIFO). Within a lane and a priority, pages go by their request's start-time fair queueing
tag (:class:`~ocrserve.policies.FairTags`): documents sent together finish one after another,
and a small request of one client overtakes the large queue of another. Each request comes with
its :class:`~ocrserve.scheduling.Terms`, resolved once (:func:`~ocrserve.scheduling.resolve`): its
lane, its order in the lane's queue, its engine class, whether it may burst, its deadline. The fast
lane's single pages may run ``fast.burst_slots`` beyond the engine's slots while another lane's
pages are in it (:func:`~ocrserve.scheduling.may_dispatch`), so one never waits for a bulk page to
leave the engine; the engine's own stages (by engine class) then let it overtake the pages in
flight.

The router enforces a request's deadline on every page it holds: a page still queued when it
passes is dropped before the engine (504); a page in the engine then is cancelled there, and so is
a page whose request went away (client gone, job cancelled): the engine aborts it (vLLM when its
request's connection closes; the embedded engine drops the remaining stages).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import math
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from ocrserve import metrics
from ocrserve.alarm import Alarm, within
from ocrserve.config import LaneConfig, RouterConfig
from ocrserve.engines.base import Engine
from ocrserve.errors import DeadlinePassed, Overloaded, PayloadTooLarge
from ocrserve.latency_limit import LatencyLimit
from ocrserve.pages import Page, PageResult
from ocrserve.policies import FairTags, create_policy
from ocrserve.preprocess.lines import counted_pixels
from ocrserve.quantiles import nearest_rank
from ocrserve.scheduling import BULK, FAST, Terms, may_dispatch
from ocrserve.servicetime import ENOUGH_PAGES, NO_WORK, RATIOS_KEPT, Readings, ServiceTime, ShareClock, Work
from ocrserve.work import Deadline, EngineClass

#: Seconds of completions the drain rate is measured over.
DRAIN_WINDOW_S = 60.0
#: Seconds between dispatch attempts while nothing wakes the dispatcher.
RECHECK_S = 0.5
#: Weight of the newest page in the moving averages of a page's cost, work and line units per pixel
#: (:meth:`Router.request_cost`, :meth:`Router.request_work`).
SERVICE_EWMA = 0.2
#: A page in the engine counts in estimates with what is left of its predicted seconds, but with
#: this share of them at least: one running past its prediction is not done yet.
IN_ENGINE_FLOOR = 0.25
#: Seconds over which the router measures how much of the time other clients' single (bursting)
#: pages were in the engine (:class:`BusyWindow`).
INTERACTIVE_WINDOW_S = 30.0
#: The share of the engine a page that may not burst still gets while one that may is in it.
#: The embedded engine runs it on threads under SCHED_IDLE (``engine.onnx.background_scheduling``)
#: once it has aged (``engine.onnx.aging_s``): a core when the interactive page's threads leave
#: one idle. Measured in the engine alone on 2 cores, phototest pages as bulk: 1.67 and 1.77
#: pages/s alone, 0.20 and 0.20 beside interactive pages back to back (0.12 of the rate); at
#: nice 10 it kept 0.50 and 0.43 of 1.73 and 1.73 (0.27).
BACKGROUND_SHARE = 0.1
#: Line units (:mod:`ocrserve.preprocess.lines`) a counted megapixel
#: (:func:`~ocrserve.preprocess.lines.counted_pixels`: at most one a page) is expected to hold
#: before any page has been decoded: about the densest pages of the development half of
#: ``../shared/corpus``, normalized on the local profile (``multi_column_miss.pdf`` 1,713,
#: ``linn.png`` 1,474, ``multicol_05.jpg`` 1,373; ``phototest.tif`` 362), so that a first burst
#: is priced as if its pages were full of text.
PRIOR_UNITS_PER_MPX = 1700.0
#: The quantile of how far fast requests held to the latency target finished past the bound they
#: were admitted on that admission leaves free below the target (:meth:`Router.latency_headroom_s`):
#: the target is one for the lane's p95.
HEADROOM_QUANTILE = 0.95
#: The most of its seconds left a request may wait at admission for evidence
#: (``router.evidence_wait_s``, :meth:`Router._await_evidence`).
EVIDENCE_WAIT_SHARE = 0.2


@dataclass(eq=False)
class Ticket:
    """One page waiting for (or running in) the engine.

    Attributes:
        cost: scheduling cost: 1 (pages) or the page's visual tokens.
        work: what it asks of the engine (:meth:`Router.page_work`), which admission prices.
        predicted_s: its share of the engine's seconds (:class:`~ocrserve.servicetime.ShareClock`)
            as predicted when it was dispatched.
        entered: the share clock's reading for its class when it was dispatched.
        single: a page that bursts: its token in :attr:`Router.interactive` while it is in the engine.
        terms: its request's scheduling terms.
        seq: ``(request's fair finish tag, admission number, page index, submission number)``, the
            order between equal priorities (:class:`~ocrserve.policies.FairTags`; the last breaks ties between tries
            of one page).
        task: the engine call once dispatched.
        answered: whether the engine answered the page (not an error): only answered pages teach
            the service-time model and the concurrency limiter what a page takes.
        context: the submitter's context variables (its request id, for log lines): the engine
            call runs in a copy of them.
    """

    page: Page
    reservation: Reservation
    cost: int
    work: Work
    terms: Terms
    seq: tuple[float, int, int, int]
    enqueued: float = field(default_factory=time.monotonic)
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    task: asyncio.Task | None = None
    answered: bool = False
    started: float = 0.0
    predicted_s: float = 0.0
    entered: float = 0.0
    single: int | None = None
    context: contextvars.Context = field(default_factory=contextvars.copy_context)

    @property
    def lane(self) -> Lane:
        """The lane the page was admitted to."""
        return self.reservation.lane

    @property
    def priority(self) -> int:
        """Its order in the lane's queue (:attr:`Terms.order`), which the queue policy reads."""
        return self.terms.order

    @property
    def deadline(self) -> Deadline | None:
        """When it must be done, or None."""
        return self.terms.deadline

    @property
    def interactive(self) -> bool:
        """Whether the engine runs it as an interactive page (:class:`~ocrserve.work.EngineClass`)."""
        return self.terms.engine_class is EngineClass.INTERACTIVE

    def had_s(self, now: Readings) -> float:
        """Its share of the engine's seconds so far, by the share clock's readings ``now``."""
        return now.of(self.interactive) - self.entered


@dataclass(eq=False)
class Promise:
    """An admitted request that single pages overtake (it does not burst) and that has a
    deadline: the seconds by which pages admitted after it may still delay it.

    Attributes:
        deadline: its deadline.
        slack_s: its deadline's seconds left at admission less its bound
            (:meth:`Router.bound_s`) without the delay of the single pages it expected beside it
            (:meth:`Router.estimate_s`), less the delay of every single page admitted since.
    """

    deadline: Deadline
    slack_s: float


@dataclass(eq=False)
class Awaiting:
    """A request not admitted yet, being previewed (:meth:`Router.held`) or waiting for evidence
    (:meth:`Router._await_evidence`): its work counts ahead of the requests that arrived after it,
    and only of those.

    Attributes:
        lane: its lane's name.
        priority: its order in the lane.
        work: its pages' expected work.
        arrival: its number in the order requests came to admission.
    """

    lane: str
    priority: int
    work: Work
    arrival: int


class Lane:
    """A bounded queue of tickets with its scheduling state and drain-rate history.

    Args:
        name: ``fast`` or ``bulk``.
        cfg: the lane's config (``queue_pages``, ``weight``, ``priority``, ``timeout_s``, ``aging_s``).
    """

    def __init__(self, name: str, cfg: LaneConfig):
        self.name = name
        self.cfg = cfg
        self._reserved: Counter[int] = Counter()  # by priority: pages admitted, not yet dispatched or released
        self._reserved_work: dict[int, Work] = {}  # by priority: their work
        self.queued_cost = 0  # cost of the pages submitted and not yet dispatched or dropped
        self.in_flight = 0
        self._clients: Counter[str] = Counter()  # admitted requests per client
        self.fair = FairTags()  # the order of its requests' pages between clients
        self._done: deque[tuple[float, float]] = deque()  # (instant, seconds) of completions within DRAIN_WINDOW_S

    @property
    def reserved(self) -> int:
        """Pages admitted and not yet dispatched or released."""
        return sum(self._reserved.values())

    def ahead(self, priority: int | None) -> int:
        """Reserved pages that go before a new request of ``priority`` (those of the same priority or
        more urgent; None: every one)."""
        return sum(n for p, n in self._reserved.items() if priority is None or p <= priority)

    def work_ahead(self, priority: int | None) -> Work:
        """The work of :meth:`ahead`'s pages (for pages not decoded yet, as admission expected it)."""
        return sum((w for p, w in self._reserved_work.items() if priority is None or p <= priority), NO_WORK)

    def reserve(self, priority: int, pages: int, work: Work) -> None:
        """Hold ``pages`` more pages asking ``work`` at ``priority`` (negative: give them back)."""
        self._reserved[priority] += pages
        self._reserved_work[priority] = self._reserved_work.get(priority, NO_WORK) + work

    @property
    def weight(self) -> int:
        """The lane's deficit-round-robin quantum (``router.<lane>.weight``)."""
        return self.cfg.weight

    @property
    def aging_s(self) -> float:
        """Seconds after which its longest-queued page goes next (``router.<lane>.aging_s``)."""
        return self.cfg.aging_s

    def record_done(self, now: float, seconds: float) -> None:
        """Note one page leaving the lane (finished in the engine) ``seconds`` after it was queued."""
        self._done.append((now, seconds))
        self._forget(now)

    def _forget(self, now: float) -> None:
        """Drop the completions older than :data:`DRAIN_WINDOW_S`."""
        while self._done and self._done[0][0] < now - DRAIN_WINDOW_S:
            self._done.popleft()

    def drain_rate(self, now: float) -> float:
        """Pages per second this lane finished over the last :data:`DRAIN_WINDOW_S` (0 if none)."""
        self._forget(now)
        if not self._done:
            return 0.0
        span = max(now - self._done[0][0], 1.0)
        return len(self._done) / span

    def latency_quantile(self, now: float, q: float) -> float | None:
        """The ``q`` quantile (nearest rank) of the seconds from queue to done of the pages this lane
        finished over the last :data:`DRAIN_WINDOW_S`; None if none did."""
        self._forget(now)
        if not self._done:
            return None
        return nearest_rank(sorted(s for _, s in self._done), q)

    @property
    def requests(self) -> int:
        """Admitted requests not yet finished."""
        return sum(self._clients.values())

    def enter(self, client: str) -> None:
        """A request of ``client`` was admitted."""
        self._clients[client] += 1
        self.publish()

    def leave(self, client: str) -> None:
        """A request of ``client`` finished (or went away)."""
        self._clients[client] -= 1
        if not self._clients[client]:
            del self._clients[client]
        self.publish()

    def queue(self, cost: int) -> None:
        """A page of ``cost`` joined the queue (``-cost``: it left it, dispatched or dropped)."""
        self.queued_cost += cost
        metrics.QUEUED_COST.labels(self.name).set(self.queued_cost)

    def publish(self) -> None:
        """Export this lane's queue figures to Prometheus."""
        metrics.QUEUED_PAGES.labels(self.name).set(self.reserved)
        metrics.QUEUE_DEPTH.labels(self.name).set(self.requests)
        metrics.ACTIVE_CLIENTS.labels(self.name).set(len(self._clients))


class BusyWindow:
    """How much of the last ``window_s`` seconds a page of a kind was in the engine, counting the
    pages of every client or of all but one.

    Args:
        window_s: the window, seconds.
    """

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._spans: deque[tuple[float, float, str]] = deque()  # (from, to, client), by end
        self._open: dict[int, tuple[float, str]] = {}  # a page still in: (since, client)
        self._tokens = itertools.count()

    def enter(self, client: str) -> int:
        """A page of the kind, ``client``'s, entered the engine; returns the token to leave with."""
        token = next(self._tokens)
        self._open[token] = (time.monotonic(), client)
        return token

    def leave(self, token: int) -> None:
        """The page that entered with ``token`` left."""
        since, client = self._open.pop(token)
        self._spans.append((since, time.monotonic(), client))

    def fraction(self, excluding: str | None = None) -> float:
        """The share of the window during which one was in, 0 to 1; pages of ``excluding`` (a
        client) left out where it sent them one at a time (:meth:`one_at_a_time`)."""
        now = time.monotonic()
        start = now - self.window_s
        while self._spans and self._spans[0][1] <= start:
            self._spans.popleft()
        left_out = excluding if excluding is not None and self.one_at_a_time(excluding) else None
        spans = [(begin, end) for begin, end, client in self._spans if client != left_out]
        spans += [(begin, now) for begin, client in self._open.values() if client != left_out]
        busy, reached = 0.0, start
        for begin, end in sorted(spans):
            begin = max(begin, reached)
            if end > begin:
                busy += end - begin
                reached = end
        return min(1.0, busy / self.window_s)

    def turned_away(self, client: str, seconds: float) -> None:
        """A page of the kind, ``client``'s, that would have been in for ``seconds`` was refused:
        it counts as in for the last ``seconds`` (demand, though it did not run)."""
        now = time.monotonic()
        self._spans.append((now - seconds, now, client))

    def one_at_a_time(self, client: str) -> bool:
        """Whether ``client``'s pages in the window came one after another: none is in now, and
        none began before the one before it had left. Such a client waits for each answer, and
        sends no more while it waits for the next request's; one whose pages overlap, or with one
        in now, sends them side by side and goes on (a stream of single pages every 0.5 s from
        the address that then sent two 4-page documents: both were admitted as if the stream
        would stop, and both answered 504)."""
        if any(owner == client for _, owner in self._open.values()):
            return False
        spans = [(begin, end) for begin, end, owner in self._spans if owner == client]  # by end
        return all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))


def _seconds(value: float) -> str:
    """``value`` seconds for a message: tenths below 10 s (a 2-s timeout shows as 0.2, not 0), else
    whole seconds."""
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def retry_after_s(waiting_pages: int, drain_rate: float, fallback_rate: float) -> int:
    """Seconds until ``waiting_pages`` have drained, by Little's law ``W = L / lambda``.

    ``drain_rate`` is the lane's recent throughput in pages/s; ``fallback_rate`` (the engine's
    overall rate) stands in when the lane has no recent history. At least 1 s.
    """
    rate = drain_rate or fallback_rate
    if rate <= 0:
        return max(1, waiting_pages)  # no history at all: assume a page a second
    return max(1, math.ceil(waiting_pages / rate))


class Router:
    """Admission, lanes and dispatch of pages to one engine.

    Args:
        engine: the engine; its ``slots`` size the dispatcher.
        cfg: the ``router`` config section.
    """

    def __init__(self, engine: Engine, cfg: RouterConfig):
        self.engine = engine
        self.cfg = cfg
        self.lanes = {FAST: Lane(FAST, cfg.fast), BULK: Lane(BULK, cfg.bulk)}
        self.policy = create_policy(cfg.mode, self.lanes.values())
        self._admitted = itertools.count()
        self._submitted = itertools.count()
        self._alarm = Alarm()
        self._task: asyncio.Task | None = None
        self._running: dict[asyncio.Task, Ticket] = {}
        self.clock = ShareClock()  # the engine's seconds as the pages in it share them
        self.interactive = BusyWindow(INTERACTIVE_WINDOW_S)  # when single (bursting) pages were in it
        self._promises: list[Promise] = []  # admitted requests single pages overtake, with deadlines
        # seconds fast requests held to the latency target finished past their bound (negative: before it)
        self._latency_overruns: deque[float] = deque(maxlen=RATIOS_KEPT)
        self._arrivals = itertools.count()  # requests in the order they came to admission
        self._awaiting: list[Awaiting] = []  # requests being previewed or waiting for evidence
        self._evidence = asyncio.Event()  # set (and replaced) when finished pages teach the model (_learn)
        self._unlearned: dict[tuple[Reservation, bool], list[tuple[Work, float]]] = {}  # :meth:`_learn`
        self.service = ServiceTime(cfg.initial_page_s)  # a page's share of them by its work
        self.interactive_service = self.service  # an interactive page's, where the engine runs those apart
        self.idle = ServiceTime(cfg.initial_page_s)  # an interactive page's on an idle engine (calibration)
        self.idle_background = ServiceTime(cfg.initial_page_s)  # a background page's, two side by side
        self.page_cost = 1.0  # moving average of a dispatched page's cost
        self.mean_work = Work(pages=1)  # moving average of a dispatched page's work
        self.units_per_mpx = PRIOR_UNITS_PER_MPX  # moving average over decoded pages
        self.limiter = LatencyLimit(self.capacity) if cfg.concurrency == "adaptive" else None
        metrics.CONCURRENCY_LIMIT.set(self.limit)

    @property
    def capacity(self) -> int:
        """Pages in flight in the engine at most."""
        return max(1, round(self.engine.slots * self.cfg.slot_overcommit))

    @property
    def limit(self) -> int:
        """Pages the dispatcher keeps in the engine now: :attr:`capacity`, or with
        ``router.concurrency: adaptive`` the latency-following limit (:mod:`ocrserve.latency_limit`)."""
        return self.limiter.limit if self.limiter else self.capacity

    async def calibrate(self, pages: list[Page]) -> None:
        """Run ``pages`` (synthetic ones of different cost, before clients are served) straight
        through the engine, one page at a time, and teach the admission's service-time models their
        seconds (at the engine's full concurrency a page takes longer; later pages correct it):
        :attr:`idle` as interactive pages (a single page's), :attr:`service` and
        :attr:`idle_background` as background ones (a document's) where the engine runs those apart
        (:attr:`~ocrserve.engines.base.Engine.background_apart`), else the same seconds. Timed as
        interactive pages alone, a fresh gateway priced a burst of 2-page documents of short
        strips at 1.04 s a page, which took 1.8 s each as the background pages they were, and
        answered the last one it admitted 504. A background page is timed as a document's pages
        run, two copies side by side (half their seconds): one's recognition overlaps the other's
        detection, on a core of its own. Measured on 2 cores (2026-12-05), a page per copy: the
        letter page 4.69 s alone, 3.56 s two side by side, 3.02 s four; the strip 1.51, 1.40 and
        1.37 s; the page of one line 2.47, 2.42 and 2.42 s.

        Where the engine runs the classes apart, interactive pages get a model of their own,
        :attr:`interactive_service`, seeded with their calibration seconds and learned from the
        single pages that finish as :attr:`service` is from the rest, and the share clock gives
        background pages :data:`BACKGROUND_SHARE` of the engine while single pages are in it
        (:class:`~ocrserve.servicetime.ShareClock`). With one model, a single page every 0.5 s beside
        a flood of turned documents (single pages 0.6 times the background price, by the share
        clock's equal shares) drew it down to 0.55 times a background page's seconds: a 4-page
        document was priced at 6.4 s of the engine, admitted, and answered 504 after 56 s.

        Each reply is capped at ``router.calibrate_max_tokens`` output tokens
        (:meth:`~ocrserve.engines.base.Engine.calibration_page`), so that a model that never ends
        its reply cannot hold ``/readyz`` for its whole ``max_tokens``."""
        works = [self.page_work(page) for page in pages]
        if apart := self.engine.background_apart:
            self.interactive_service = ServiceTime(self.cfg.initial_page_s)
            self.clock.background_share = BACKGROUND_SHARE
        for page, work in zip(pages, works, strict=True):
            seconds = await self._calibration_s(page, EngineClass.INTERACTIVE)
            self.idle.record(work, seconds)
            if apart:
                self.interactive_service.record(work, seconds)
                seconds = await self._calibration_s(page, EngineClass.BACKGROUND, copies=2)
            self.service.record(work, seconds)
            self.idle_background.record(work, seconds)
        if works:
            self.mean_work = sum(works, NO_WORK).scaled(1 / len(works))

    async def _calibration_s(self, page: Page, engine_class: EngineClass, copies: int = 1) -> float:
        """Seconds a page the engine takes to OCR ``copies`` copies of calibration ``page`` side by
        side as pages of ``engine_class``."""
        started = time.monotonic()
        max_tokens = self.cfg.calibrate_max_tokens
        await asyncio.gather(
            *(self.engine.calibration_page(page, priority=engine_class, max_tokens=max_tokens) for _ in range(copies))
        )
        return (time.monotonic() - started) / copies

    @property
    def in_flight(self) -> int:
        """Pages in the engine now."""
        return sum(lane.in_flight for lane in self.lanes.values())

    def page_cost_of(self, page: Page) -> int:
        """A decoded page's cost (``router.cost``): its visual tokens (at least 1), or 1."""
        return max(1, page.visual_tokens) if self.cfg.cost == "visual_tokens" else 1

    def page_work(self, page: Page) -> Work:
        """A decoded page's work: the pixels the engine reads for it and its line units (0 where
        they were not counted)."""
        height, width = page.image.shape[:2]
        return Work(1, self.engine.input_pixels(height, width), page.line_units or 0.0)

    def request_work(self, sizes: list[tuple[int, int]] | None, pages: int, units: Sequence[float | None] = ()) -> Work:
        """The work of ``pages`` pages not decoded yet: from their normalized ``(width, height)``
        ``sizes`` where known, else (a job's page, admitted before it is claimed) ``pages`` x the
        moving average of a page's work. Their pixels are exact; their line units those counted on
        previews of the first pages (``units``, in the order of ``sizes``; None: not previewed),
        the others' at the previewed pages' units per counted pixel
        (:func:`~ocrserve.preprocess.lines.counted_pixels`), or without any, the pages decoded
        lately's."""
        if sizes is None:
            return self.mean_work.scaled(pages)
        pixels = sum(self.engine.input_pixels(h, w) for w, h in sizes)
        counted = [counted_pixels(h, w) for w, h in sizes]
        seen = [(u, c) for u, c in zip(units, counted, strict=False) if u is not None]  # the first pages
        seen_pixels = sum(c for _, c in seen)
        density = sum(u for u, _ in seen) * 1e6 / seen_pixels if seen_pixels else self.units_per_mpx
        unseen = sum(counted) - seen_pixels
        return Work(len(sizes), pixels, sum(u for u, _ in seen) + unseen * density / 1e6)

    def request_cost(self, pages: int, visual_tokens: int | None) -> int:
        """A request's cost: with ``router.cost: visual_tokens`` its ``visual_tokens``, or where they
        are not known yet (a job's page, admitted before it is claimed) ``pages`` x the moving
        average of a page's cost; with ``pages``, its pages."""
        if self.cfg.cost != "visual_tokens":
            return pages
        return visual_tokens or max(1, round(pages * self.page_cost))

    def start(self) -> None:
        """Start the dispatcher on the running event loop."""
        self._task = asyncio.create_task(self._dispatch_loop(), name="ocrserve-dispatcher")

    async def close(self) -> None:
        """Stop dispatching; queued pages are left unanswered (their requests are going away)."""
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def admit(
        self,
        terms: Terms,
        pages: int,
        visual_tokens: int | None = None,
        work: Work | None = None,
        arrival: int | None = None,
    ) -> AsyncIterator[Reservation]:
        """Reserve room for ``pages`` pages in the request's lane for the duration of a request.

        Yields the reservation to pass to :meth:`submit`; pages never submitted are released
        on exit. The lane shares the engine between clients (``terms.client``, :class:`~ocrserve.policies.FairTags`)
        by the request's cost: its ``visual_tokens`` with ``router.cost: visual_tokens`` (where
        given), else its pages. Only pages that go before ``terms.order`` count against the lane's
        ``queue_pages`` and the request's estimate, so a flood of documents cannot shut a single
        page out. Requests not admitted yet count ahead of it where they came before it
        (``arrival``, the number :meth:`held` gave it; None: it comes now). The estimate prices the
        request's ``work`` (:meth:`request_work`; where not given, its pages at the average page's);
        a ``terms.deadline`` that its bound (:meth:`bound_s`) passes is refused now, or where only
        the cost model's margin for what it has not seen passes it and ``router.evidence_wait_s``
        is set, after waiting for evidence (:meth:`_await_evidence`).

        Raises:
            PayloadTooLarge: ``pages`` exceeds the lane's whole queue (413: retrying cannot help).
            Overloaded: the lane's queue cannot take ``pages`` more now (503 or 429, ``Retry-After``),
                or the request could not finish before its deadline (503, ``Retry-After`` from
                :meth:`estimate_s`), or single pages would make requests admitted before them late
                (503 ``engine-promised``: :meth:`_keep_promises`).
        """
        lane = self.lanes[terms.lane]
        priority = terms.order
        arrival = next(self._arrivals) if arrival is None else arrival
        self._check_room(lane, pages, priority)
        cost = self.request_cost(pages, visual_tokens)
        work = work or self.request_work(None, pages)
        bursting = terms.bursts and self.bursts
        frozen = None
        if wait_s := self._evidence_wait_s(lane, terms, bursting):
            frozen = await self._await_evidence(lane, terms, work, arrival, wait_s)
            self._check_room(lane, pages, priority)
        alone, beside_single_pages = self._estimate(lane, work, priority, bursting, terms.client, arrival, frozen)
        estimate = alone + beside_single_pages
        bound = self._bound(estimate, work, self._pages_ahead(lane, priority, bursting, arrival), bursting=bursting)
        if terms.deadline is not None:
            self._check_deadline(lane, pages, terms, bound, work)
        due = None  # when a request held to the latency target should be done by its bound
        if lane.name == FAST and not terms.deadline_is_clients and self.has_latency_target:
            latency_bound = self._bound(estimate, work, 1.0, bursting=bursting)
            due = self._check_latency_target(lane, work, latency_bound, terms.arrived, bursting)
        if bursting:
            self._keep_promises(lane, work, terms.client)
        promise = None
        if not bursting and terms.deadline is not None:  # the single pages its bound expects are its own to give
            promise = Promise(terms.deadline, terms.deadline.left() - bound + beside_single_pages)
        reservation = Reservation(lane, work, priority, next(self._admitted), *lane.fair.tag(terms.client, cost))
        admitted = time.monotonic()
        lane.enter(terms.client)
        if promise:
            self._promises.append(promise)
        try:
            yield reservation
        finally:
            reservation.release(reservation.pending)
            lane.leave(terms.client)
            if promise:
                self._promises.remove(promise)
            if reservation.used or terms.deadline is not None:  # not the jobs worker's room, held each poll
                self._account(lane, admitted, estimate, bound, terms.deadline)
            if due is not None and reservation.used:
                self._latency_overruns.append(time.monotonic() - due)

    def _keep_promises(self, lane: Lane, work: Work, client: str) -> None:
        """Admit single pages asking ``work`` only where the requests already admitted that they
        overtake (:class:`Promise`) can still finish by their deadlines: their pages get
        :data:`BACKGROUND_SHARE` of the engine while a single page is in it, so each loses the
        single pages' :meth:`own_s` times ``1 -`` that from its slack. Admission prices single
        pages to come by the share of the last seconds they took (:meth:`estimate_s`); a stream
        that starts with or after a document is not in it: two 4-page documents admitted as a
        stream of single pages began from the same address, every 0.5 s, were answered 504.

        A page refused so counts in :attr:`interactive` as if it had run its seconds: it is demand
        all the same, and documents admitted while single pages are refused for their sake would
        refuse more of them (a flood of turned documents beside a single page every 0.5 s: 4
        documents admitted and 107 of 145 single pages refused, where 1 and 2 had been).

        Raises:
            Overloaded: a promise's slack would run out (503 ``engine-promised``, ``Retry-After``
                until the first such request is done by its bound).
        """
        own = self.own_s(work, bursting=True)
        delay = own * (1 - BACKGROUND_SHARE)
        broken = [promise for promise in self._promises if promise.slack_s < delay]
        if broken:
            # until the first of them is done by its bound (with the pages that overtook it since)
            wait = max(1, math.ceil(min(promise.deadline.left() - promise.slack_s for promise in broken)))
            self.interactive.turned_away(client, own)
            metrics.REJECTIONS.labels(lane.name, "engine_promised").inc()
            raise Overloaded(
                f"the engine's time for the next {wait} s is promised to requests admitted before, which this "
                f"page would overtake and make late; retry in {wait} s",
                slug="engine-promised",
                headers={"Retry-After": str(wait)},
            )
        for promise in self._promises:
            promise.slack_s -= delay

    @contextlib.asynccontextmanager
    async def held(self, terms: Terms, pages: int, least: Work) -> AsyncIterator[int]:
        """Hold room for a request while its pages are previewed to count their line units
        (:meth:`~ocrserve.preprocess.Preprocessor.previews`, up to 0.3 s a page in a decoding
        process, and about as long to count), after refusing now, as :meth:`admit` would, what no
        text could save: ``pages`` the lane's queue cannot take, or a deadline that they overrun
        were they the ``least`` work they can be (their pixels without text: :meth:`check_held`).
        The hold is its pages in the lane's queue and their least work ahead of the requests that
        arrive after it (:class:`Awaiting`), until the block exits; it yields the request's arrival
        number, which :meth:`admit` (called once the block has exited) takes to replace the hold
        with the priced request. Without the hold, ten 4-page documents sent at once were all
        previewed before any was admitted, and the nine refused waited up to 7.5 s for it. Counted
        ahead of requests that came before it too, the holds of a fresh gateway's burst of twelve
        2-page documents put 60-90 s of work ahead of each on an idle engine, and all twelve were
        refused.

        Raises:
            PayloadTooLarge, Overloaded: as :meth:`admit`.
        """
        lane = self.lanes[terms.lane]
        arrival = next(self._arrivals)
        self._check_room(lane, pages, terms.order)
        self.check_held(terms, pages, least, arrival)
        lane.reserve(terms.order, pages, NO_WORK)
        try:
            with self._not_admitted(Awaiting(lane.name, terms.order, least, arrival)):
                yield arrival
        finally:
            lane.reserve(terms.order, -pages, NO_WORK)

    def check_held(self, terms: Terms, pages: int, least: Work, arrival: int) -> None:
        """Refuse a request of ``pages`` pages whose deadline even their ``least`` work overruns,
        behind the work ahead of arrival ``arrival``: without the margin for the unseen where
        evidence may yet save it (:meth:`admit` would wait for it, and a page ahead of it is
        expected to finish within the wait: :meth:`next_page_s`), with it otherwise.
        :meth:`held` checks on entry; the service again when the request's turn to be previewed
        comes (:class:`~ocrserve.service.OcrService`), as the requests admitted meanwhile may
        leave it no room.

        Raises:
            Overloaded: as :meth:`admit`.
        """
        if terms.deadline is None:
            return
        lane = self.lanes[terms.lane]
        bursting = terms.bursts and self.bursts
        estimate = sum(self._estimate(lane, least, terms.order, bursting, terms.client, arrival))
        ahead = self._pages_ahead(lane, terms.order, bursting, arrival)
        # without the margin where evidence may yet save it: a page ahead is due within the wait
        margin = not ahead or self._evidence_wait_s(lane, terms, bursting) <= self.next_page_s()
        bound = self._bound(estimate, least, ahead, margin, bursting)
        self._check_deadline(lane, pages, terms, bound, least)

    def probe_wanted(self, terms: Terms, work: Work) -> bool:
        """Whether a request asking ``work`` under ``terms``, just refused at its deadline, should
        have a page run as a probe of the cost model
        (:meth:`~ocrserve.service.OcrService.probe`): the model is warming
        (:attr:`~ocrserve.servicetime.ServiceTime.warming`), the router is :attr:`vacant` (no page
        can finish and narrow the margin, no other client's request shares the engine and would
        slow the probe's page, and no other request is on its way to admission: where
        one refused for the requests ahead of it started a probe while the first of a burst was
        being previewed, that one was then priced with the probe's page in the engine and refused,
        and a burst of twelve 2-page documents of which one had been admitted got none in), and the
        request alone, priced without the margin for what the model has not seen (:meth:`_bound`),
        would fit its deadline: only that margin refused it. The margin narrows only as pages
        finish, so a fresh gateway that refuses every document sent to it never narrows it: beside
        a CPU hog, sixteen clients retrying 2-page dense documents with a 40 s timeout were all
        refused to the end, on an idle engine that would have read one in about 25 s."""
        if terms.deadline is None or not self.service.warming or not self.vacant:
            return False
        return self.alone_s(work, terms.bursts and self.bursts, margin=False) <= terms.deadline.left()

    @property
    def vacant(self) -> bool:
        """Whether no request is admitted or waiting for admission (being previewed, or waiting for
        evidence) and no page, ours or another client's
        (:meth:`~ocrserve.engines.base.Engine.others_inside`), is in the engine."""
        if self._running or self._awaiting or any(lane.requests for lane in self.lanes.values()):
            return False
        return not self.engine.others_inside()

    def alone_s(self, work: Work, bursting: bool = False, margin: bool = True) -> float:
        """What admission would hold a request asking ``work`` to on an idle engine (its pages'
        own part of :meth:`_bound`, nothing ahead; as pages that burst where ``bursting``), with
        the margin for what the cost model has not seen unless not ``margin``, seconds."""
        return self._bound(self.own_s(work, bursting), work, 0.0, margin, bursting)

    @contextlib.contextmanager
    def _not_admitted(self, awaiting: Awaiting) -> Iterator[None]:
        """Count ``awaiting`` ahead of the requests that arrive after it (:meth:`_awaited`) for the
        block."""
        self._awaiting.append(awaiting)
        try:
            yield
        finally:
            self._awaiting.remove(awaiting)

    def _check_room(self, lane: Lane, pages: int, priority: int) -> None:
        """Refuse ``pages`` that exceed the lane's whole queue (413), or that it cannot take now."""
        if pages > lane.cfg.queue_pages:
            raise PayloadTooLarge(
                f"{pages} pages exceed the {lane.name} lane's queue of router.{lane.name}.queue_pages="
                f"{lane.cfg.queue_pages}",
                slug="too-many-pages",
            )
        if lane.ahead(priority) + pages > lane.cfg.queue_pages:
            self._refuse(lane, pages, priority)

    def _refuse(self, lane: Lane, pages: int, priority: int) -> None:
        now = time.monotonic()
        rate = lane.drain_rate(now)
        ahead = lane.ahead(priority)
        wait = retry_after_s(ahead, rate, self._overall_rate(now))
        metrics.REJECTIONS.labels(lane.name, "queue_full").inc()
        problem = Overloaded(
            f"the {lane.name} lane holds {ahead} of {lane.cfg.queue_pages} pages and cannot take "
            f"{pages} more; "
            + (f"draining at {rate:.2f} pages/s" if rate > 0 else "no page has finished lately to measure its drain")
            + f", retry in {wait} s",
            slug="queue-full",
            headers={"Retry-After": str(wait)},
        )
        problem.status = self.cfg.overload_status
        raise problem

    @property
    def bursts(self) -> bool:
        """Whether pages whose terms may burst have burst slots to do it (``router.fast.burst_slots``
        under the lanes policy)."""
        return self.policy.bursts and self.cfg.fast.burst_slots > 0

    def estimate_s(
        self, lane: Lane, work: Work, priority: int | None = None, bursts: bool = False, client: str | None = None
    ) -> float:
        """Seconds until a request asking ``work`` (:meth:`request_work`) of ``priority``, admitted
        to ``lane`` now, would be done: the work ahead of it (the lane's admitted pages of that
        priority or more urgent, :meth:`Lane.work_ahead`; for bulk the fast lane's too), what is
        left of the pages in the engine (:meth:`in_engine_s`) and its own, priced by the
        service-time model (:class:`~ocrserve.servicetime.ServiceTime`: a dense page takes longer
        than a receipt, a narrow strip longer than its pixels say) in shares of the engine's seconds
        (:class:`~ocrserve.servicetime.ShareClock`), which add up however many pages the engine runs
        at once. Decoding is left out: it overlaps the engine's work on earlier pages. Work other
        clients queued inside the engine (vLLM's waiting requests,
        :meth:`~ocrserve.engines.base.Engine.queued_inside`) runs first: :meth:`inside_s`. A request
        whose pages ``bursts`` (:attr:`bursts`) waits in the engine only for the pages there that
        burst too: it overtakes the others (a burst slot, and its engine class at every stage).
        Counting the others refused single pages at once beside a flood of large documents that
        they were in fact answered beside in 0.7-1.2 s. Any other request gets what single pages
        leave of the engine: where single pages were in it a fraction ``f`` of the last
        :data:`INTERACTIVE_WINDOW_S`, its seconds are divided by
        ``1 - f + f x`` :data:`BACKGROUND_SHARE`. Without it, 8 of 11 flooding 4-page documents
        admitted beside a single page every 0.5 s were answered 504. A client's own single pages
        do not count where it sent them one after another (:meth:`BusyWindow.one_at_a_time`): one
        that did, then a 4-page document, had it refused on an idle engine as 264 s of work (the
        corpus, in order). Counting only the time single pages shared the engine with other pages
        instead let documents in at the start of a flood beside a stream of single pages, and 3
        of 3 were answered 504."""
        return sum(self._estimate(lane, work, priority, bursts, client))

    def _estimate(
        self,
        lane: Lane,
        work: Work,
        priority: int | None,
        bursts: bool,
        client: str | None,
        arrival: int | None = None,
        frozen: Readings | None = None,
    ) -> tuple[float, float]:
        """:meth:`estimate_s` in two parts: the seconds without single pages, and what the single
        pages expected beside it add (0 for a request that ``bursts``). The requests not admitted
        yet count ahead of it (those that came before ``arrival``, where given); the pages in the
        engine count what was left of them at the share clock's readings ``frozen``, where given
        (:meth:`in_engine_s`)."""
        in_engine = self.in_engine_s(bursting_only=bursts, frozen=frozen)
        ahead = self._work_ahead(lane, priority, arrival)
        seconds = self._model(bursts).seconds(ahead) + in_engine + self.own_s(work, bursts) + self.inside_s()
        if bursts:
            return seconds, 0.0
        busy = self.interactive.fraction(excluding=client)
        return seconds, (seconds - self.inside_s()) * (1 / (1 - busy + busy * BACKGROUND_SHARE) - 1)

    def _work_ahead(self, lane: Lane, priority: int | None, arrival: int | None = None) -> Work:
        """The work queued ahead of a request of ``priority`` in ``lane`` (:meth:`Lane.work_ahead`;
        for bulk the fast lane's too), with the requests not admitted yet that came before
        ``arrival`` (None: all)."""
        ahead = lane.work_ahead(priority) + self._awaited(lane.name, priority, arrival)
        if lane.name == BULK:
            ahead += self.lanes[FAST].work_ahead(None) + self._awaited(FAST, None, arrival)
        return ahead

    def _pages_ahead(self, lane: Lane, priority: int | None, bursts: bool, arrival: int | None = None) -> float:
        """The pages queued ahead of a request (:meth:`_work_ahead`) and in the engine (those that
        burst, for a request that ``bursts``)."""
        in_engine = len(self._in_engine(bursts))
        return self._work_ahead(lane, priority, arrival).pages + in_engine

    def _awaited(self, lane: str, priority: int | None, arrival: int | None) -> Work:
        """The work of the requests not admitted yet in ``lane`` (:class:`Awaiting`) that go before
        a request of ``priority`` (as :meth:`Lane.work_ahead`) and came before ``arrival`` (None:
        all)."""
        return sum(
            (
                a.work
                for a in self._awaiting
                if a.lane == lane
                and (priority is None or a.priority <= priority)
                and (arrival is None or a.arrival < arrival)
            ),
            NO_WORK,
        )

    def _evidence_wait_s(self, lane: Lane, terms: Terms, bursting: bool) -> float:
        """How long a request may wait for evidence (:meth:`_await_evidence`): while the cost
        model is warming, until ``router.evidence_wait_s`` after it arrived (its upload, inspection
        and previews count) and at most :data:`EVIDENCE_WAIT_SHARE` of its seconds left; 0 for a
        single page that bursts or a request held to the fast lane's latency target (both would
        rather be refused at once) and one without a deadline. Counted from admission instead, the
        wait began after the previews and line counts of a whole burst: a fresh gateway beside a
        CPU hog refused the last of twelve 2-page documents after 12.0 s."""
        if bursting or terms.deadline is None or not self.service.warming:
            return 0.0
        if lane.name == FAST and not terms.deadline_is_clients and self.has_latency_target:
            return 0.0
        waited = terms.since_arrival_s()
        return max(0.0, min(self.cfg.evidence_wait_s - waited, EVIDENCE_WAIT_SHARE * terms.deadline.left()))

    async def _await_evidence(
        self, lane: Lane, terms: Terms, work: Work, arrival: int, wait_s: float
    ) -> Readings | None:
        """Wait, for up to ``wait_s`` (:meth:`_evidence_wait_s`), while only the cost model's
        margin for what it has not seen (:meth:`~ocrserve.servicetime.ServiceTime.prior_margin`)
        would refuse a request: each page that finishes shortens the work ahead, and once it is
        learned (:meth:`_learn`: with the pages of its request beside it) narrows the margin, so
        the request is then priced again. Ends once its bound (:meth:`bound_s`) fits its
        deadline, once even the bound without the margin does not, once the model is warm, once
        no page is ahead of it or in the engine (none can finish), or once no page is expected to
        finish before the time is up (:meth:`next_page_s`, by the model's own prediction).
        Meanwhile its work counts ahead of the requests that arrive after it.

        Returns None where pages were learned while it waited, else the share clock's reading when
        it began: :meth:`admit` then prices the pages in the engine as they were then
        (:meth:`in_engine_s`). Only a learned page is evidence: the model's own count of the
        engine's progress while nothing finished is what the margin doubts. Re-pricing on it, a
        cold gateway beside a CPU hog let in a 2-page document after a full 5-s wait in which no
        page finished, and answered it 504 at 57.55 s of its 57.5. A first burst arrives before
        any page has finished: without the wait it was priced on the margin alone, and a fresh
        gateway admitted 4 of 12 2-page receipts that a warm one admitted 10 of, with no request
        late in either."""
        started = time.monotonic()
        until = started + wait_s
        came, frozen = self._evidence, self.clock.now()
        try:
            with self._not_admitted(Awaiting(lane.name, terms.order, work, arrival)):
                while self.service.warming and (wait := until - time.monotonic()) > self.next_page_s():
                    unlearned = frozen if self._evidence is came else None
                    estimate = sum(self._estimate(lane, work, terms.order, False, terms.client, arrival, unlearned))
                    ahead, left = self._pages_ahead(lane, terms.order, False, arrival), terms.deadline.left()
                    if (
                        not ahead  # no page can finish meanwhile
                        or self._bound(estimate, work, ahead) <= left
                        or self._bound(estimate, work, ahead, False) > left
                    ):
                        break
                    evidence = self._evidence
                    with contextlib.suppress(TimeoutError):
                        await within(evidence.wait(), wait)
        finally:
            if (waited := time.monotonic() - started) > 1e-3:
                metrics.ADMISSION_EVIDENCE_WAIT_SECONDS.labels(lane.name).observe(waited)
        return None if self._evidence is not came else frozen

    def next_page_s(self) -> float:
        """Seconds until a page is expected to finish: the page in the engine nearest its end (what
        is left of its predicted share, in wall seconds beside the others), or with none in it, an
        average page's (:attr:`mean_work`)."""
        now = self.clock.now()
        left = [max(0.0, t.predicted_s - t.had_s(now)) for t in self._running.values()]
        if left:
            return min(left) * max(1, self.clock.pages)
        return self.service.seconds(self.mean_work)

    def _in_engine(self, bursting_only: bool) -> list[Ticket]:
        """The pages in the engine now (those that burst, with ``bursting_only``: what a request
        whose pages burst waits for, and whose over-run it shares)."""
        return [t for t in self._running.values() if t.terms.bursts or not bursting_only]

    def in_engine_s(self, bursting_only: bool = False, frozen: Readings | None = None) -> float:
        """Seconds of work left in the engine (of its pages that burst, with ``bursting_only``):
        each page's predicted share less what it has had (by the share clock's readings ``frozen``
        for its class, where given, and none for a page that entered after it), at least
        :data:`IN_ENGINE_FLOOR` of it."""
        now = self.clock.now() if frozen is None else self.clock.now().earliest(frozen)
        return sum(
            max(t.predicted_s - max(0.0, t.had_s(now)), IN_ENGINE_FLOOR * t.predicted_s)
            for t in self._in_engine(bursting_only)
        )

    def own_s(self, work: Work, bursting: bool = False) -> float:
        """A request's own part of :meth:`estimate_s`: its pages' shares of the engine (as
        interactive pages where ``bursting``: :meth:`_model`), and at least one of its pages'
        seconds on an idle engine (:meth:`_idle`: a page is not done sooner however many the
        engine batches)."""
        one_page = work.scaled(1 / max(work.pages, 1))
        return max(self._model(bursting).seconds(work), self._idle(bursting).seconds(one_page))

    def _model(self, interactive: bool) -> ServiceTime:
        """The model of the shares of the engine pages take: :attr:`interactive_service` for
        ``interactive`` ones (those that burst), else :attr:`service`; one model where the engine
        does not run the classes apart (:meth:`calibrate`)."""
        return self.interactive_service if interactive else self.service

    def _idle(self, bursting: bool = True) -> ServiceTime:
        """The model of a page's seconds on an idle engine: :attr:`idle` (interactive pages, those
        that burst) or, unless ``bursting``, :attr:`idle_background`; :attr:`service` where it
        was not calibrated."""
        idle = self.idle if bursting else self.idle_background
        return idle if idle.measured else self.service

    def bound_s(self, lane: Lane, work: Work, priority: int | None = None, bursts: bool = False) -> float:
        """What admission holds a request to: :meth:`estimate_s` with the work ahead of it times
        :meth:`upper_factor`, its own part times the over-runs seen (:meth:`_bound`)."""
        estimate = self.estimate_s(lane, work, priority, bursts)
        return self._bound(estimate, work, self._pages_ahead(lane, priority, bursts), bursting=bursts)

    def _bound(self, estimate: float, work: Work, ahead: float, margin: bool = True, bursting: bool = False) -> float:
        """:meth:`bound_s` of an ``estimate`` of a request asking ``work`` behind ``ahead`` pages
        (:meth:`_pages_ahead`): the work ahead times the service-time model's
        :meth:`~ocrserve.servicetime.ServiceTime.upper_factor` for that many pages (without the
        prior's margin unless ``margin``), its own part (:meth:`own_s`) times what evidence says
        of over-runs alone (:meth:`~ocrserve.servicetime.ServiceTime.over_run` of its pages), and
        with ``margin``, the prior's too where anything is ahead of it; either at least the pages
        in the engine's :meth:`slowdown` (of the pages that burst, where the request is one that
        ``bursting``: it overtakes the others). Its own part at its mean let a 2-page dense document in
        at 43 s of a 45 s deadline, and answered it 504 on a machine whose other core was taken.
        With ``margin`` its own part carries the prior's margin whatever is ahead of it: without
        it behind other work, a fresh gateway admitted a second 2-page dense document (8.4 Mpx
        and a letter page) behind the first and answered it 504; without it alone on an idle
        engine, a fresh gateway beside a CPU hog admitted a lone 2-page document of 22-px text
        that ran 55 s against its 45 s deadline (a fresh gateway now refuses what needs more than
        two thirds of its deadline until finished pages narrow the margin)."""
        slowdown, own, model = self.slowdown(bursting), self.own_s(work, bursting), self._model(bursting)
        own_factor = max(model.over_run(work.pages), slowdown)
        if margin:
            own_factor = max(own_factor, model.prior_margin())
        ahead_factor = model.upper_factor(ahead) if margin else model.over_run(ahead)
        return own * own_factor + (estimate - own) * max(ahead_factor, slowdown)

    def inside_s(self) -> float:
        """Seconds until the engine has started what others queued inside it (vLLM's waiting
        requests from other clients, :meth:`~ocrserve.engines.base.Engine.queued_inside`),
        priced as pages of ours where the engine cannot tell."""
        queued, drain_s = self.engine.queued_inside()
        if not queued:
            return 0.0
        if drain_s is None:
            return self.service.seconds(self.mean_work.scaled(queued))
        return drain_s

    def upper_factor(self) -> float:
        """What admission multiplies the work ahead of a request by (:meth:`bound_s`): the service-time model's
        :meth:`~ocrserve.servicetime.ServiceTime.upper_factor` (a high quantile of how far finished
        pages ran over their prediction), or the median over-run of the pages in the engine now
        where larger, so a machine that slowed down shows before its pages finish."""
        return max(self.service.upper_factor(), self.slowdown())

    def slowdown(self, bursting: bool = False) -> float:
        """The median over-run of the pages in the engine now: their shares so far over their
        predicted shares (1 with none in it). For a request whose pages burst (``bursting``), of
        the pages in it that burst only: the others yield it the cores, and their over-run grows
        by design while single pages pass them (beside a bulk flood of scans, a single page that
        took 0.5 s was refused 14 times in 7.5 s, priced at 4.9-7.0 s)."""
        now = self.clock.now()
        running = sorted(t.had_s(now) / t.predicted_s for t in self._in_engine(bursting) if t.predicted_s)
        return running[len(running) // 2] if running else 1.0

    @property
    def has_latency_target(self) -> bool:
        """Whether the fast lane has a latency target (``latency_target_s`` or
        ``latency_target_multiple`` set)."""
        return bool(self.cfg.fast.latency_target_s or self.cfg.fast.latency_target_multiple)

    def latency_target_s(self, work: Work, bursting: bool = True) -> float:
        """The fast lane's latency target for a request asking ``work``:
        ``router.fast.latency_target_s``, or ``latency_target_multiple`` x its seconds on an idle
        engine (the calibration pages' fit, as interactive pages for a request whose pages burst,
        else as background ones, as admission prices it; without calibration, the finished pages'
        fit: the debug engine takes a minute a page); its pages side by side in the engine's slots."""
        if self.cfg.fast.latency_target_s:
            return self.cfg.fast.latency_target_s
        idle_s = self._idle(bursting).seconds(work) / max(1.0, min(work.pages, self.limit))
        return self.cfg.fast.latency_target_multiple * idle_s

    def _check_latency_target(
        self, lane: Lane, work: Work, bound: float, arrived: float | None, bursting: bool
    ) -> float:
        """Refuse now a fast request without its own ``timeout`` that would not be done within the
        lane's :meth:`latency_target_s` (for pages that burst where ``bursting``) of when it
        ``arrived`` (``time.monotonic()``; None: now): the seconds it took to reach admission (its
        upload, inspection, previews), ``bound`` more
        (:meth:`_bound` with one page's quantile for the work ahead, not the narrower one of many
        pages together: the target is one for the lane's p95, not a deadline), and the
        :meth:`latency_headroom_s`. With the narrower bound and without the seconds before
        admission, the fast lane of a soak at twice its capacity answered at p95 6.54 s against a
        target of 6.1 s; with the seconds before admission, 4.26 s against 3.7; with both, and
        without the headroom, 5.67 s against 5.55.

        Returns:
            When the request is due by its bound without the headroom (``time.monotonic()``).
        """
        target = self.latency_target_s(work, bursting)
        pages = round(work.pages)
        now = time.monotonic()
        due = now + bound
        bound += now - arrived if arrived is not None else 0.0
        bound += self.latency_headroom_s()
        if bound <= target:
            return due
        wait = max(1, math.ceil(bound - target))
        metrics.REJECTIONS.labels(lane.name, "latency_target").inc()
        raise Overloaded(
            f"the {lane.name} lane would answer {pages} page(s) in about {bound:.1f} s, above its latency target of "
            f"{target:.1f} s (router.fast.latency_target_s); retry in {wait} s, send a timeout to wait longer, or "
            "send it to be done asynchronously (Prefer: respond-async, or POST /v1/jobs)",
            slug="latency-target",
            headers={"Retry-After": str(wait)},
        )

    def latency_headroom_s(self) -> float:
        """Seconds admission leaves free below the fast lane's latency target: the
        :data:`HEADROOM_QUANTILE` quantile (nearest rank) of how far the last requests held to it
        finished past the bound they were admitted on, once :data:`ENOUGH_PAGES` have; else 0.
        The bound prices the engine's seconds only; what else a request waits for (its result's
        assembly, an event loop busy with other uploads) adds to every one, and a lane kept at its
        target by the load answers at the target plus that."""
        if len(self._latency_overruns) < ENOUGH_PAGES:
            return 0.0
        return max(0.0, nearest_rank(sorted(self._latency_overruns), HEADROOM_QUANTILE))

    def _check_deadline(self, lane: Lane, pages: int, terms: Terms, estimate: float, work: Work) -> None:
        """Refuse now what could not finish before ``terms.deadline`` (``estimate`` s of work ahead
        and in it: :meth:`bound_s`) rather than accept it and time out. Where even its ``work``
        alone on an idle engine (its bound with nothing ahead) passes it, a retry with the same
        ``timeout`` cannot help: the refusal says to send a longer one, and how much of it went
        before admission (since ``terms.arrived``: its upload, inspection and previews)."""
        deadline = terms.deadline
        left = deadline.left()
        if estimate <= left:
            return
        wait = max(1, math.ceil(estimate - left))
        metrics.REJECTIONS.labels(lane.name, "deadline_unmeetable").inc()
        inside = self.inside_s()
        bursting = terms.bursts and self.bursts
        if (alone := self.alone_s(work, bursting)) > left:
            before = terms.since_arrival_s()
            used = f"; {before:.1f} s of its timeout went to its upload and inspection" if before >= 0.5 else ""
            others = f"; besides, {inside:.0f} s of work is queued in the engine by other clients" if inside else ""
            advice = (
                f"even on an idle engine it would take about {_seconds(alone)} s{used}{others}; send a longer timeout, "
                "or send it to be done asynchronously"
            )
        else:
            others = f"; {inside:.0f} s of it queued in the engine by other clients" if inside else ""
            advice = (
                f"about {estimate:.0f} s of work would be ahead of and in it ({self.limit} pages in the engine at once"
                f"{others}); retry in {wait} s, or send it to be done asynchronously"
            )
        raise Overloaded(
            f"the {lane.name} lane cannot finish {pages} page(s) within the request's {_seconds(left)} s: {advice} "
            "(Prefer: respond-async, or POST /v1/jobs)",
            slug="deadline-unmeetable",
            headers={"Retry-After": str(wait)},
        )

    @staticmethod
    def _account(lane: Lane, admitted: float, estimate: float, bound: float, deadline: Deadline | None) -> None:
        """How an admitted request's time compared with its admission estimate and bound, and
        whether it still missed its deadline (``ocrserve_admission_estimate_error_seconds``,
        ``ocrserve_admission_bound_ratio``, ``ocrserve_admitted_deadline_misses_total``)."""
        seconds = time.monotonic() - admitted
        metrics.ADMISSION_ESTIMATE_ERROR.labels(lane.name).observe(seconds - estimate)
        metrics.ADMISSION_BOUND_RATIO.labels(lane.name).observe(seconds / max(bound, 1e-3))
        if deadline is not None and deadline.passed():
            metrics.ADMITTED_DEADLINE_MISSES.labels(lane.name).inc()

    def _overall_rate(self, now: float) -> float:
        return sum(lane.drain_rate(now) for lane in self.lanes.values())

    async def submit(self, page: Page, reservation: Reservation, terms: Terms) -> PageResult:
        """Queue one admitted page and wait for its result.

        Args:
            page: a normalized page.
            reservation: the request's admission (from :meth:`admit`).
            terms: its request's scheduling terms (a job's page: its job's, which may differ from
                the ones its room in the lane was reserved with).

        Raises:
            DeadlinePassed: the deadline passed while the page was queued or in the engine.
            PageError: the engine failed on this page.
        """
        lane = reservation.lane
        deadline = terms.deadline
        cost, work = self.page_cost_of(page), self.page_work(page)
        reservation.submitted(work)
        counted = counted_pixels(*page.image.shape[:2])
        self.units_per_mpx += SERVICE_EWMA * ((page.line_units or 0.0) * 1e6 / max(counted, 1) - self.units_per_mpx)
        seq = (reservation.finish, reservation.order, page.index, next(self._submitted))
        ticket = Ticket(page, reservation, cost, work, terms, seq)
        self.policy.push(ticket)
        lane.queue(cost)
        self._alarm.ring()
        try:
            await asyncio.wait({ticket.future}, timeout=deadline.left() if deadline else None)
        except asyncio.CancelledError:
            self._abandon(ticket, "cancelled")
            raise
        if not ticket.future.done():
            self._abandon(ticket, "deadline")
            where = "in the engine" if ticket.task else "in the queue"
            raise DeadlinePassed(f"page {page.index + 1}: its deadline passed {where}")
        return ticket.future.result()

    def _learn(self, ticket: Ticket, share: float | None) -> None:
        """Teach the service-time model a page that left the engine with ``share`` seconds of it
        (None: not answered, nothing to learn) together with the pages of its request that were
        in the engine beside it: while one of those is still in it, and fewer than
        :attr:`limit` are held, the page is held; then the pages held are learned at once, each
        with their summed share split in proportion to their predictions, and only then is the
        evidence a request waiting at admission waits for given (:meth:`_await_evidence`).

        Pages in the engine side by side do not split its seconds evenly: the embedded engine
        runs one page's stages mostly before the other's, so the page that leaves first is
        charged little and the other much. A dense 2-page document alone on 2 cores (2026-12-06):
        shares 7.1 and 17.7 s against 9.7 and 9.3 s predicted, 24.8 s together against 19.0. Learned
        page by page, the first to leave of a fresh gateway's first document (6.0 s against 8.7 s)
        halved the model's seconds per line unit before the other left, and a retrying client was
        admitted on that at 14.5 s of work, ran about 30 s and was answered 504 at its 45-s timeout."""
        key = (ticket.reservation, ticket.interactive)
        held = self._unlearned.setdefault(key, [])
        if share is not None:
            held.append((ticket.work, share))
        beside = any(
            t.reservation is ticket.reservation and t.interactive == ticket.interactive for t in self._running.values()
        )
        if beside and len(held) < self.limit:
            return
        del self._unlearned[key]
        if not held:
            return
        model = self._model(ticket.interactive)
        predicted = [model.seconds(work) for work, _ in held]
        scale = sum(seconds for _, seconds in held) / sum(predicted)
        for (work, _), seconds in zip(held, predicted, strict=True):
            model.record(work, seconds * scale)
        self._evidence.set()
        self._evidence = asyncio.Event()

    def _abandon(self, ticket: Ticket, reason: str) -> None:
        """Its request no longer waits (``deadline`` or ``cancelled``): drop the page from the queue,
        or cancel it in the engine."""
        if ticket.task is None:
            if self.policy.remove(ticket):
                ticket.reservation.dequeue(ticket.work)
                ticket.lane.queue(-ticket.cost)
                metrics.REJECTIONS.labels(ticket.lane.name, reason).inc()
        elif not ticket.task.done():
            ticket.task.cancel()
            metrics.ABORTED_PAGES.labels(ticket.lane.name, reason).inc()

    async def _dispatch_loop(self) -> None:
        while True:
            # Woken by a new page or a finished one; the timeout re-checks an engine that was
            # saturated by other clients (the vLLM engine learns it from its own polls).
            await self._alarm.sleep(RECHECK_S)
            while (ticket := self.policy.pop(self._may_run)) is not None:
                if ticket.deadline is not None and ticket.deadline.passed():
                    self._expire(ticket)  # its submitter has not woken up yet
                else:
                    self._start(ticket)

    def _expire(self, ticket: Ticket) -> None:
        """A page popped after its deadline: it fails without reaching the engine."""
        ticket.reservation.dequeue(ticket.work)
        ticket.lane.queue(-ticket.cost)
        metrics.REJECTIONS.labels(ticket.lane.name, "deadline").inc()
        ticket.future.set_exception(DeadlinePassed(f"page {ticket.page.index + 1}: its deadline passed in the queue"))

    def _may_run(self, ticket: Ticket) -> bool:
        """A free slot, or for a page whose terms may burst (a fast request of at most
        ``fast.urgent_pages`` pages) one of the fast lane's burst slots while pages that may not
        (the bulk lane's, a fast document's) are in the engine
        (:func:`~ocrserve.scheduling.may_dispatch`); nothing while the engine
        reports its own queue backed up (so the waiting happens here, where it can be ordered)."""
        burst = self.cfg.fast.burst_slots if self.policy.bursts else 0
        unburstable = sum(not running.terms.bursts for running in self._running.values())
        return may_dispatch(ticket.terms, self.in_flight, self.limit, burst, self.engine.saturated(), unburstable)

    def _start(self, ticket: Ticket) -> None:
        lane = ticket.lane
        ticket.reservation.dequeue(ticket.work)
        lane.queue(-ticket.cost)
        lane.fair.dispatched(ticket.reservation.start)
        lane.in_flight += 1
        self.page_cost += SERVICE_EWMA * (ticket.cost - self.page_cost)
        self.mean_work += (ticket.work - self.mean_work).scaled(SERVICE_EWMA)
        lane.publish()
        metrics.SLOTS_IN_USE.set(self.in_flight)
        metrics.QUEUE_WAIT_SECONDS.labels(lane.name).observe(time.monotonic() - ticket.enqueued)
        metrics.ENGINE_PAGES.labels(lane.name).inc()
        ticket.started = time.monotonic()
        ticket.entered = self.clock.enter(ticket.interactive)
        ticket.predicted_s = self._model(ticket.interactive).seconds(ticket.work)
        ticket.task = ticket.context.run(asyncio.create_task, self._run(ticket))
        self._running[ticket.task] = ticket
        if ticket.terms.bursts:
            ticket.single = self.interactive.enter(ticket.terms.client)
        # bookkeeping in a callback: it runs even when the task is cancelled before its first step
        ticket.task.add_done_callback(lambda task: self._finished(ticket, task))

    async def _run(self, ticket: Ticket) -> None:
        try:
            engine_class = ticket.terms.engine_class
            result = await self.engine.ocr_page(ticket.page, priority=engine_class, deadline=ticket.deadline)
        except Exception as exc:  # PageError, or a bug in the engine: this page alone fails
            if not ticket.future.done():
                ticket.future.set_exception(exc)
        else:
            ticket.answered = True
            if not ticket.future.done():
                ticket.future.set_result(result)

    def _finished(self, ticket: Ticket, task: asyncio.Task) -> None:
        """The page left the engine (answered, failed or aborted): free its slot."""
        self._running.pop(task, None)
        ticket.lane.in_flight -= 1
        share = self.clock.leave(ticket.entered, ticket.interactive)
        if ticket.single is not None:
            self.interactive.leave(ticket.single)
        now = time.monotonic()
        if not task.cancelled():  # aborted pages say nothing of the lane's drain rate
            ticket.lane.record_done(now, now - ticket.enqueued)
        # an engine's error (vLLM's 400 for a page over max_model_len) comes at once: not learned
        self._learn(ticket, share if ticket.answered else None)
        if ticket.answered and self.limiter:
            self.limiter.record(now - ticket.started)
            metrics.CONCURRENCY_LIMIT.set(self.limit)
        metrics.SLOTS_IN_USE.set(self.in_flight)
        self._alarm.ring()


class Reservation:
    """Room a request holds in a lane: pages admitted and not yet dispatched or dropped, and the
    work they ask (:class:`~ocrserve.servicetime.Work`): for pages not decoded yet as admission
    expected it, for queued ones their own.

    Args:
        lane: the lane.
        work: the work its pages are expected to ask (``work.pages`` pages); added to the lane's now.
        priority: the request's priority, which the pages are reserved at (:meth:`Lane.ahead`).
        order: the request's admission number (its pages' place in the lane).
        start, finish: its fair-queueing tags (:class:`~ocrserve.policies.FairTags`).
    """

    def __init__(self, lane: Lane, work: Work, priority: int, order: int, start: float, finish: float):
        self.lane = lane
        self.priority = priority
        self.order = order
        self.start, self.finish = start, finish
        self.pending, self.pending_work = round(work.pages), work  # pages not submitted yet, their expected work
        self.used = False  # whether a page was submitted with it
        lane.reserve(priority, self.pending, work)

    def _share(self, pages: int) -> Work:
        """The expected work of ``pages`` of the pending pages (all that is left for the last)."""
        return self.pending_work if pages >= self.pending else self.pending_work.scaled(pages / self.pending)

    def release(self, pages: int) -> None:
        """Give back ``pages`` pages never submitted (skipped: a blank page, a page that failed
        decoding; or left when the request ends)."""
        pages = min(pages, self.pending)
        if pages:
            share = self._share(pages)
            self.pending -= pages
            self.pending_work -= share
            self.lane.reserve(self.priority, -pages, NO_WORK - share)

    def submitted(self, work: Work) -> None:
        """One of its pages was decoded and queued asking ``work``: that replaces its share of the
        expected work (a page beyond the reservation, a job page's retry, joins it)."""
        self.used = True
        share = self._share(1) if self.pending else NO_WORK
        added = 0 if self.pending else 1
        self.pending = max(0, self.pending - 1)
        self.pending_work -= share
        self.lane.reserve(self.priority, added, work - share)

    def dequeue(self, work: Work) -> None:
        """A queued page asking ``work`` left the queue (dispatched or dropped)."""
        self.lane.reserve(self.priority, -1, NO_WORK - work)
