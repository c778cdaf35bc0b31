"""Scheduling policies: which queued page the router hands the engine's next free slot.

One small interface, :class:`QueuePolicy`, with a factory, :func:`create_policy`, after vLLM's own
scheduler queues (``vllm/v1/core/sched/request_queue.py``: ``RequestQueue`` with
``FCFSRequestQueue`` and ``PriorityRequestQueue``, made by ``create_request_queue``):

- :class:`FifoPolicy` (``router.mode: fifo``): one first-come-first-served queue for every lane,
  to measure what the lanes buy.
- :class:`LanesPolicy` (``router.mode: lanes``): one queue per lane, ordered within the lane by
  ``(priority, seq)``: lower priority value first, as in vLLM's ``PriorityRequestQueue``; then by
  the router's ``seq``, which puts a page in its request's place (fair between clients, in order
  within one: :mod:`ocrserve.router`), except that a page queued for the lane's ``aging_s`` goes
  next whatever its priority (*aging*, the textbook cure for starvation under strict priorities:
  Silberschatz, Galvin and Gagne, "Operating System Concepts", priority scheduling), and
  *weighted deficit round robin* between the lanes (Shreedhar and Varghese, "Efficient fair
  queueing using deficit round robin", SIGCOMM 1995), with cost in pages or visual tokens: when
  both lanes wait, the fast lane goes first and gets ``fast.weight`` cost units for every
  ``bulk.weight`` the bulk lane gets, so bulk keeps the share ``bulk.weight / (sum of weights)``.

Within a lane and an order, pages go by their request's start-time fair queueing tags
(:class:`FairTags`), which share the lane between clients.

A policy only orders; the router decides whether a lane's next page may run now (free or burst
slots, engine backpressure: :func:`ocrserve.scheduling.may_dispatch`) and passes that as
``may_run``.
"""

from __future__ import annotations

import abc
import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol


class Queued(Protocol):
    """What a policy needs of a queued page (the router's ``Ticket``)."""

    cost: int
    priority: int
    seq: tuple[float, int, int, int]
    enqueued: float  # time.monotonic() when it was queued

    @property
    def lane(self) -> PolicyLane: ...


class PolicyLane(Protocol):
    """What a policy needs of a lane (the router's ``Lane``)."""

    name: str
    weight: int
    aging_s: float


#: Whether a lane's next page may go to the engine now.
MayRun = Callable[[Queued], bool]
#: Clients a lane keeps fair-queueing tags for before dropping those whose tags are past.
MAX_TAGGED_CLIENTS = 1024


class FairTags:
    """Start-time fair queueing over requests (Goyal, Vin and Cheng, "Start-time fair queueing",
    SIGCOMM 1996), one per lane: a new request's ``start = max(virtual time, the client's last
    finish)``, ``finish = start + cost`` (its pages, or their visual tokens: ``router.cost``).
    Pages go by their request's finish tag: requests that arrive together finish one after another
    (equal tags: admission order), a client's next request queues behind its own earlier ones, and
    a small request from a client with nothing queued overtakes a large one, so one client's 48
    queued pages delay another's single page by about one page.

    Attributes:
        virtual: the start tag of the request last dispatched from.
    """

    def __init__(self) -> None:
        self.virtual = 0.0
        self._finish: dict[str, float] = {}  # each client's last finish tag

    def tag(self, client: str, cost: float) -> tuple[float, float]:
        """A new request's ``(start, finish)`` tags for ``client`` at ``cost``."""
        start = max(self.virtual, self._finish.get(client, 0.0))
        self._finish[client] = finish = start + cost
        if len(self._finish) > MAX_TAGGED_CLIENTS:  # clients whose tags are in the past need none
            self._finish = {c: f for c, f in self._finish.items() if f > self.virtual}
        return start, finish

    def dispatched(self, start: float) -> None:
        """A page of a request tagged ``start`` went to the engine: virtual time moves to it."""
        self.virtual = max(self.virtual, start)


class QueuePolicy(abc.ABC):
    """The order in which queued pages reach the engine."""

    #: Whether the fast lane's burst slots (``router.fast.burst_slots``) apply under this policy.
    bursts: bool = True

    @abc.abstractmethod
    def push(self, ticket: Queued) -> None:
        """Queue a page."""

    @abc.abstractmethod
    def pop(self, may_run: MayRun) -> Queued | None:
        """The next page to run among the lanes whose next page ``may_run``, or None."""

    @abc.abstractmethod
    def remove(self, ticket: Queued) -> bool:
        """Take a queued page out (its request went away); False when it was not queued."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Pages queued."""


class FifoPolicy(QueuePolicy):
    """One queue in arrival order, whatever the lane or priority (and no burst slots)."""

    bursts = False

    def __init__(self) -> None:
        self._queue: deque[Queued] = deque()

    def push(self, ticket: Queued) -> None:
        self._queue.append(ticket)

    def pop(self, may_run: MayRun) -> Queued | None:
        if self._queue and may_run(self._queue[0]):
            return self._queue.popleft()
        return None

    def remove(self, ticket: Queued) -> bool:
        try:
            self._queue.remove(ticket)
        except ValueError:
            return False
        return True

    def __len__(self) -> int:
        return len(self._queue)


class PriorityQueue:
    """Pages of one lane, lowest ``(priority, seq)`` first (vLLM's ``PriorityRequestQueue`` order),
    but the page queued longest first once it has waited ``aging_s`` seconds (0: never).

    Args:
        aging_s: seconds (on the tickets' ``enqueued`` clock, ``time.monotonic``) after which the
            longest-queued page goes next.
    """

    def __init__(self, aging_s: float = 0.0) -> None:
        self._heap: list[tuple[int, tuple[float, int, int, int], Queued]] = []
        self._arrivals: dict[int, Queued] = {}  # id -> ticket, in the order they were queued
        self.aging_s = aging_s

    def push(self, ticket: Queued) -> None:
        heapq.heappush(self._heap, (ticket.priority, ticket.seq, ticket))
        self._arrivals[id(ticket)] = ticket

    def peek(self, now: float) -> Queued:
        """The next page at ``now`` (``time.monotonic()``; the queue must not be empty)."""
        oldest = next(iter(self._arrivals.values()))
        if self.aging_s and now - oldest.enqueued >= self.aging_s:
            return oldest
        return self._heap[0][2]

    def first(self) -> Queued:
        """The next page by ``(priority, seq)`` alone, aging aside (the queue must not be empty)."""
        return self._heap[0][2]

    def take(self, ticket: Queued) -> Queued:
        """Remove and return ``ticket``, the page :meth:`peek` gave."""
        if ticket is self._heap[0][2]:
            heapq.heappop(self._heap)
            del self._arrivals[id(ticket)]
        else:
            self.remove(ticket)
        return ticket

    def remove(self, ticket: Queued) -> bool:
        """Take ``ticket`` out (O(n): queues hold at most a lane's ``queue_pages``)."""
        entry = (ticket.priority, ticket.seq, ticket)
        try:
            self._heap.remove(entry)
        except ValueError:
            return False
        heapq.heapify(self._heap)
        del self._arrivals[id(ticket)]
        return True

    def __len__(self) -> int:
        return len(self._heap)


class LanesPolicy(QueuePolicy):
    """A priority queue per lane, weighted deficit round robin between lanes (module docstring).

    Args:
        lanes: the lanes, most urgent first: ties in a round go to the earlier one.
    """

    def __init__(self, lanes: Iterable[PolicyLane]):
        self._lanes = list(lanes)
        self._queues = {lane.name: PriorityQueue(lane.aging_s) for lane in self._lanes}
        self._deficit = {lane.name: 0.0 for lane in self._lanes}

    def push(self, ticket: Queued) -> None:
        self._queues[ticket.lane.name].push(ticket)

    def pop(self, may_run: MayRun) -> Queued | None:
        for lane in self._lanes:
            if not self._queues[lane.name]:
                self._deficit[lane.name] = 0.0  # DRR: an idle lane keeps no credit
        # one instant for the whole choice: the page may_run approved is the page taken
        now = time.monotonic()
        heads = {name: self._head(queue, now, may_run) for name, queue in self._queues.items() if queue}
        candidates = [lane for lane in self._lanes if lane.name in heads and may_run(heads[lane.name])]
        if not candidates:
            return None
        # Deficit round robin, advanced straight to the first round in which some lane can pay.
        rounds = min(
            max(0, math.ceil((heads[lane.name].cost - self._deficit[lane.name]) / lane.weight)) for lane in candidates
        )
        for lane in candidates:
            self._deficit[lane.name] += rounds * lane.weight
        lane = next(lane for lane in candidates if self._deficit[lane.name] >= heads[lane.name].cost)
        ticket = self._queues[lane.name].take(heads[lane.name])
        self._deficit[lane.name] -= ticket.cost
        return ticket

    @staticmethod
    def _head(queue: PriorityQueue, now: float, may_run: MayRun) -> Queued:
        """The lane's next page: :meth:`PriorityQueue.peek`'s, unless that one (an aged page) may
        not run now and the first by priority may (a single page, past it into a burst slot): an
        aged page waiting for a slot does not hold back a page that could run. Measured before:
        a single page beside a flood of 4-page documents waited 14-24 s behind their aged pages."""
        head = queue.peek(now)
        return head if may_run(head) else queue.first()

    def remove(self, ticket: Queued) -> bool:
        return self._queues[ticket.lane.name].remove(ticket)

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())


def create_policy(mode: str, lanes: Iterable[PolicyLane]) -> QueuePolicy:
    """The policy ``router.mode`` names: ``lanes`` or ``fifo``.

    Raises:
        ValueError: another mode.
    """
    if mode == "lanes":
        return LanesPolicy(lanes)
    if mode == "fifo":
        return FifoPolicy()
    raise ValueError(f"router.mode={mode!r}: expected lanes or fifo")
