"""The scheduling terms and the queue policies alone, without an engine or an event loop: which lane,
what order, what engine class, who may burst, which page goes next and how lanes and clients share."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from ocrserve.config import RouterConfig
from ocrserve.policies import FairTags, FifoPolicy, LanesPolicy, PriorityQueue, create_policy
from ocrserve.scheduling import BULK, FAST, choose_lane, inspection_class, may_dispatch, resolve
from ocrserve.work import Deadline, EngineClass, Priority, WorkItem

CFG = RouterConfig()
_order = itertools.count()


@dataclass
class PolicyLane:
    name: str
    weight: int = 1
    aging_s: float = 0.0


@dataclass(eq=False)
class Queued:
    """A queued page as a policy sees it (the router's ``Ticket``)."""

    lane: PolicyLane
    priority: int = 0
    cost: int = 1
    enqueued: float = 0.0
    seq: tuple = field(default_factory=lambda: (0.0, next(_order), 0, 0))


def test_lane_by_size_unless_named():
    assert choose_lane(WorkItem(), CFG, 1, 2_000_000) == FAST
    assert choose_lane(WorkItem(), CFG, 5, 2_000_000) == BULK  # more than fast.max_pages = 4
    assert choose_lane(WorkItem(), CFG, 2, 20_000_000) == BULK  # more than fast.max_pixels = 16 Mpx
    assert choose_lane(WorkItem(lane=FAST), CFG, 40, 10**9) == FAST  # priority=interactive
    assert choose_lane(WorkItem(lane=BULK), CFG, 1, 10) == BULK  # priority=bulk


def test_terms_resolved_once_from_the_request_and_the_config():
    single = resolve(WorkItem(), CFG, 1)
    assert (single.lane, single.order, single.engine_class, single.bursts) == (FAST, 0, EngineClass.INTERACTIVE, True)
    # a fast document waits one step after single pages in the lane, never bursts, and runs as
    # background in the engine, so a single page overtakes its pages' stages there too
    document = resolve(WorkItem(), CFG, 3)
    assert (document.lane, document.order, document.engine_class, document.bursts) == (
        FAST,
        1,
        EngineClass.BACKGROUND,
        False,
    )
    wider = RouterConfig.model_validate({"fast": {"urgent_pages": 4}})
    assert resolve(WorkItem(), wider, 3).order == 0 and resolve(WorkItem(), wider, 3).bursts
    bulk = resolve(WorkItem(), CFG, 5)
    assert (bulk.lane, bulk.order, bulk.engine_class, bulk.bursts) == (BULK, 10, EngineClass.BACKGROUND, False)
    job = resolve(WorkItem(priority=Priority.of_job(9, 9, CFG.bulk.priority), lane=BULK), CFG, 1)
    assert (job.order, job.engine_class) == (10, EngineClass.BACKGROUND)


def test_the_lanes_default_deadline_is_not_the_clients():
    lane_default = resolve(WorkItem(), CFG, 1)
    assert lane_default.deadline is not None and not lane_default.deadline_is_clients
    assert 59 < lane_default.deadline.left() <= CFG.fast.timeout_s
    clients = resolve(WorkItem(deadline=Deadline.after(5)), CFG, 1)
    assert clients.deadline_is_clients and clients.deadline.left() <= 5
    none = resolve(WorkItem(lane=BULK), RouterConfig.model_validate({"bulk": {"timeout_s": 0}}), 1)
    assert none.deadline is None and not none.deadline_is_clients


def test_inspection_runs_as_the_named_lane_or_interactive():
    assert inspection_class(WorkItem()) is EngineClass.INTERACTIVE
    assert inspection_class(WorkItem(lane=BULK)) is EngineClass.BACKGROUND


def test_burst_slots_only_for_pages_whose_terms_burst_past_pages_that_may_not():
    single, document = resolve(WorkItem(), CFG, 1), resolve(WorkItem(), CFG, 3)
    busy = {"limit": 4, "burst_slots": 1, "saturated": False}
    assert may_dispatch(single, in_flight=3, unburstable_in_engine=0, **busy)
    assert may_dispatch(
        single, in_flight=4, unburstable_in_engine=1, **busy
    )  # its burst slot, past a bulk page or a document's
    assert not may_dispatch(single, in_flight=5, unburstable_in_engine=1, **busy)
    assert not may_dispatch(document, in_flight=4, unburstable_in_engine=1, **busy)
    # single pages alone fill the slots: no burst, so a slot that frees goes by the lanes' weights
    assert not may_dispatch(single, in_flight=4, unburstable_in_engine=0, **busy)
    # an engine backed up by others holds pages back in the router, except those that burst
    assert not may_dispatch(document, in_flight=0, limit=4, burst_slots=1, saturated=True, unburstable_in_engine=1)
    assert may_dispatch(single, in_flight=1, limit=4, burst_slots=1, saturated=True, unburstable_in_engine=1)
    assert not may_dispatch(single, in_flight=1, limit=4, burst_slots=0, saturated=True, unburstable_in_engine=1)


def test_priority_queue_orders_by_priority_then_seq_and_ages():
    lane = PolicyLane("fast")
    queue = PriorityQueue(aging_s=10.0)
    old_document = Queued(lane, priority=1, enqueued=0.0)
    singles = [Queued(lane, priority=0, enqueued=1.0 + i) for i in range(2)]
    for ticket in (old_document, *singles):
        queue.push(ticket)
    assert queue.peek(now=5.0) is singles[0]  # strict priority before aging_s
    assert queue.peek(now=10.0) is old_document  # waited aging_s: goes next whatever its priority
    assert queue.take(queue.peek(now=10.0)) is old_document
    assert [queue.take(queue.peek(now=10.0)) for _ in range(2)] == singles
    assert len(queue) == 0


def test_lanes_share_by_weight_in_cost_units_and_an_idle_lane_keeps_no_credit():
    fast, bulk = PolicyLane(FAST, weight=4), PolicyLane(BULK, weight=1)
    policy = LanesPolicy([fast, bulk])
    for _ in range(12):
        policy.push(Queued(fast))
    for _ in range(6):
        policy.push(Queued(bulk))
    order = "".join(policy.pop(lambda t: True).lane.name[0] for _ in range(18))
    assert order == "ffffbffffbffffbbbb"
    # by cost: one bulk page of 4 units is worth four fast pages of 1
    for _ in range(8):
        policy.push(Queued(fast))
    policy.push(Queued(bulk, cost=4))
    order = "".join(policy.pop(lambda t: True).lane.name[0] for _ in range(9))
    assert order.index("b") >= 4, order
    assert policy.pop(lambda t: True) is None


def test_a_lane_whose_page_may_not_run_is_passed_over():
    fast, bulk = PolicyLane(FAST, weight=4), PolicyLane(BULK)
    policy = LanesPolicy([fast, bulk])
    policy.push(document := Queued(fast, priority=1))
    policy.push(bulk_page := Queued(bulk))
    assert policy.pop(lambda t: t.lane is bulk) is bulk_page  # the fast head may not run now
    assert policy.remove(document) and not policy.remove(document) and len(policy) == 0


def test_an_aged_page_that_may_not_run_does_not_hold_back_a_single_page_that_may():
    """The aged document page goes next when a slot frees; until then a single page that may take
    a burst slot goes past it, rather than waiting for the slot too."""
    fast = PolicyLane(FAST, aging_s=10.0)
    policy = LanesPolicy([fast])
    policy.push(document := Queued(fast, priority=1, enqueued=-60.0))  # queued a minute ago: aged
    policy.push(single := Queued(fast, priority=0))
    burst_only = lambda t: t.priority == 0  # noqa: E731 - the engine's slots are full; a single page may burst
    assert policy.pop(burst_only) is single
    assert policy.pop(burst_only) is None
    assert policy.pop(lambda t: True) is document


def test_fifo_keeps_arrival_order_across_lanes_and_has_no_bursts():
    policy = create_policy("fifo", [])
    assert isinstance(policy, FifoPolicy) and not policy.bursts
    tickets = [Queued(PolicyLane(name)) for name in (BULK, FAST, BULK)]
    for ticket in tickets:
        policy.push(ticket)
    assert policy.pop(lambda t: False) is None
    assert [policy.pop(lambda t: True) for _ in tickets] == tickets
    with pytest.raises(ValueError, match="expected lanes or fifo"):
        create_policy("random", [])


def test_fair_tags_let_a_small_request_overtake_another_clients_queue():
    tags = FairTags()
    a1 = tags.tag("a", 6)  # client a queues 6 pages
    a2 = tags.tag("a", 1)  # and one more request: behind its own
    b1 = tags.tag("b", 1)  # client b's single page
    assert a1 == (0.0, 6.0) and a2 == (6.0, 7.0) and b1 == (0.0, 1.0)
    assert sorted(["a1", "a2", "b1"], key=lambda n: {"a1": a1, "a2": a2, "b1": b1}[n][1]) == ["b1", "a1", "a2"]
    tags.dispatched(6.0)  # virtual time moves on: a newcomer starts from it, not from 0
    assert tags.tag("c", 2) == (6.0, 8.0)
