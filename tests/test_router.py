"""The router against the real embedded engine: lanes, DRR share, priorities, backpressure, deadlines, FIFO."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time

import numpy as np
import pytest
import pytest_asyncio

from ocrserve import metrics
from ocrserve.config import EngineConfig, OnnxEngineConfig, PreprocessConfig, RouterConfig
from ocrserve.engines.base import PageError
from ocrserve.engines.onnx import OnnxEngine
from ocrserve.errors import DeadlinePassed, Overloaded, PayloadTooLarge
from ocrserve.pages import Page
from ocrserve.pipeline import PagePipeline
from ocrserve.preprocess import Preprocessor
from ocrserve.preprocess.lines import line_units
from ocrserve.preprocess.synthetic import calibration_pages
from ocrserve.router import BACKGROUND_SHARE, Router, retry_after_s
from ocrserve.scheduling import BULK, FAST, Terms, resolve
from ocrserve.servicetime import UNSEEN_FACTOR, Work
from ocrserve.work import Deadline, EngineClass, Priority, WorkItem
from tests.samples import phototest

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: Seconds within which a refusal "at once" comes: far under any wait for evidence here (2.4 s and
#: more), and over what a busy 2-core machine takes to schedule the event loop (0.1 s was not).
AT_ONCE_S = 1.0


def blank(index: int = 0) -> Page:
    """A small white page: the detector finds nothing, so it runs in milliseconds."""
    return Page(index=index, image=np.full((64, 64, 3), 255, np.uint8), width=64, height=64, visual_tokens=4)


def text_page(index: int = 0) -> Page:
    image = np.asarray(phototest())
    return Page(index=index, image=image, width=640, height=480, visual_tokens=300, line_units=line_units(image))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    eng = OnnxEngine(EngineConfig(onnx=OnnxEngineConfig(det_workers=1)))
    await eng.start()
    yield eng
    await eng.close()


@pytest_asyncio.fixture(loop_scope="module")
async def make_router(engine):
    routers = []

    def make(**overrides) -> Router:
        # capacity 1 (2 slots x 0.5): dispatch order equals completion order
        settings = {"slot_overcommit": 0.5, **overrides}
        # these tests are about order; the fast lane's latency target has tests of its own
        settings["fast"] = {"latency_target_s": 3600.0, **settings.get("fast", {})}
        cfg = RouterConfig.model_validate(settings)
        router = Router(engine, cfg)
        router.start()
        routers.append(router)
        return router

    yield make
    for router in routers:
        await router.close()


def terms(
    router: Router, lane: str, pages: int = 1, deadline: Deadline | None = None, client: str = "", order=None
) -> Terms:
    """A request's terms as the service resolves them, for ``lane`` (and ``order``, when given)."""
    priority = None if order is None else Priority(order)
    return resolve(WorkItem(deadline=deadline, priority=priority, lane=lane, client=client), router.cfg, pages)


async def run_tagged(router: Router, lane: str, tag: str, page: Page, done: list[str], order: int | None = None):
    request = terms(router, lane, order=order)
    async with router.admit(request, 1) as reservation:
        await router.submit(page, reservation, request)
    done.append(tag)


async def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_fast_overtakes_queued_bulk(make_router):
    router = make_router(fast={"burst_slots": 0})
    done: list[str] = []
    bulk = [asyncio.create_task(run_tagged(router, BULK, f"b{i}", text_page(i), done)) for i in range(4)]
    await wait_until(lambda: router.in_flight == 1)  # b0 is in the engine, b1..b3 queue
    fast = [asyncio.create_task(run_tagged(router, FAST, f"f{i}", blank(i), done)) for i in range(2)]
    await asyncio.gather(*bulk, *fast)
    assert done == ["b0", "f0", "f1", "b1", "b2", "b3"]


async def test_bulk_keeps_its_minimum_share(make_router):
    router = make_router(
        fast={"burst_slots": 0}
    )  # weights fast 4 : bulk 1 -> bulk gets 1 of every 5 pages under contention
    done: list[str] = []
    tasks = [asyncio.create_task(run_tagged(router, FAST, f"f{i}", blank(i), done)) for i in range(12)]
    tasks += [asyncio.create_task(run_tagged(router, BULK, f"b{i}", blank(i), done)) for i in range(6)]
    await asyncio.gather(*tasks)
    lanes = "".join(tag[0] for tag in done)
    assert lanes == "ffffbffffbffffbbbb"


async def test_fast_burst_passes_bulk_in_flight(make_router):
    router = make_router()  # capacity 1, fast.burst_slots 1
    done: list[str] = []
    bulk = asyncio.create_task(run_tagged(router, BULK, "b0", text_page(), done))
    await wait_until(lambda: router.in_flight == 1)  # b0 holds the only slot
    await run_tagged(router, FAST, "f0", blank(), done)  # runs beside it, ahead at every stage
    await bulk
    assert done == ["f0", "b0"]


async def test_only_other_clients_single_pages_slow_a_document(make_router):
    """A client's own single pages, sent one after another, leave its document's estimate as it was
    (it sends no more while it waits); another client's divide it (what they leave of the engine)."""
    router = make_router()
    for index in range(3):
        request = terms(router, FAST, client="a")
        async with router.admit(request, 1) as reservation:
            await router.submit(text_page(index), reservation, request)
    assert router.interactive.fraction(excluding="a") == 0.0
    assert 0.0 < router.interactive.fraction(excluding="b") == router.interactive.fraction()
    document = Work(4, 4e6, 4000)
    own = router.estimate_s(router.lanes[FAST], document, client="a")
    assert router.estimate_s(router.lanes[FAST], document, client="b") > own


async def test_a_requests_line_units_are_those_counted_on_its_previews(make_router):
    """Pages previewed before admission count their line units; the others, the previewed pages'
    units per counted pixel; without previews, the pages decoded lately's."""
    router = make_router()
    sizes = [(1000, 1000)] * 6  # a megapixel each: counted whole
    assert router.request_work(sizes, 6, [1000, None, 500]).units == pytest.approx(1500 + 4 * 750)
    assert router.request_work(sizes, 6).units == pytest.approx(6 * router.units_per_mpx)
    large = [(2000, 3000)]  # counted on a megapixel of it
    assert router.request_work(large, 1).units == pytest.approx(router.units_per_mpx)


async def test_a_request_hopeless_even_without_text_is_refused_before_its_previews(make_router):
    """The check before previews refuses only what no text could make possible: a deadline that the
    pages' pixels alone overrun, or a lane too full for them."""
    router = make_router(fast={"queue_pages": 8})
    sizes = [(2000, 3000)] * 4
    least = router.request_work(sizes, 4, [0] * 4)
    async with router.held(terms(router, FAST, 4, deadline=Deadline.after(3600)), 4, least):
        pass
    with pytest.raises(Overloaded, match="cannot finish 4 page"):
        async with router.held(terms(router, FAST, 4, deadline=Deadline.after(0.01)), 4, least):
            pass
    with pytest.raises(PayloadTooLarge):
        async with router.held(terms(router, FAST, 9), 9, router.request_work([(2000, 3000)] * 9, 9, [0] * 9)):
            pass


async def test_a_request_being_previewed_holds_its_least_work_ahead_of_requests_after_it(make_router):
    """While its pages are previewed, a request's pages and their least work are in the lane: a
    request that arrives meanwhile counts them (room and seconds), one that came before it does
    not, and they are gone after."""
    router = make_router(fast={"queue_pages": 8})
    lane = router.lanes[FAST]
    least = router.request_work([(2000, 3000)] * 4, 4, [0] * 4)
    alone = router.estimate_s(lane, least)
    async with (
        router.held(terms(router, FAST, 2), 2, least.scaled(1 / 2)) as first,
        router.held(terms(router, FAST, 4), 4, least) as second,
    ):
        assert lane.reserved == 6 and second > first
        # the second's hold is not ahead of the first, which came before it
        assert sum(router._estimate(lane, least, None, False, None, first)) == pytest.approx(alone)
        held_ahead = router.service.seconds(least.scaled(3 / 2))
        assert router.estimate_s(lane, least) == pytest.approx(alone + held_ahead)
        with pytest.raises(Overloaded, match="holds 6 of 8 pages and cannot take 5 more"):
            async with router.held(terms(router, FAST, 5), 5, least.scaled(5 / 4)):
                pass
    assert lane.reserved == 0 and lane.work_ahead(None) == Work() and not router._awaiting
    assert router.estimate_s(lane, least) == pytest.approx(alone)


async def test_single_pages_that_would_make_an_admitted_document_late_are_refused(make_router):
    """A document admitted with 1.5 s to spare keeps them: single pages, which overtake it, are
    admitted while their delay to it fits in that slack, then refused at once (503
    ``engine-promised``) until it is done."""
    router = make_router()
    fast = router.lanes[FAST]
    document = router.request_work([(1000, 1000)] * 4, 4, [1000] * 4)
    single = router.request_work([(480, 640)], 1, [239])
    page = terms(router, FAST, 1)
    delay = router.own_s(single) * (1 - BACKGROUND_SHARE)
    document_terms = terms(router, FAST, 4, deadline=Deadline.after(router.bound_s(fast, document) + 1.5))
    assert page.bursts and not document_terms.bursts
    admitted = 0
    async with router.admit(document_terms, 4, work=document):
        with pytest.raises(Overloaded) as refused:
            for _ in range(1000):
                async with router.admit(page, 1, work=single):
                    admitted += 1
    assert admitted in (math.floor(1.5 / delay) - 1, math.floor(1.5 / delay))
    # retry once the document is done by its bound, with the pages that overtook it: before its deadline
    assert refused.value.slug == "engine-promised"
    assert 1 <= int(refused.value.headers["Retry-After"]) <= math.ceil(document_terms.deadline.left())
    # the refused page is demand all the same: documents that come now are priced beside it
    assert router.interactive.fraction() > 0
    async with router.admit(page, 1, work=single):  # the document is done: nothing promised
        pass


async def test_requests_sent_together_finish_one_after_another(make_router):
    """Three 3-page requests whose pages arrive interleaved (as their decoding finishes) behind a
    busy engine: each request's pages go before those of requests admitted after it."""
    router = make_router()
    done: list[str] = []
    blocker = asyncio.create_task(run_tagged(router, BULK, "blocker", text_page(), done))
    await wait_until(lambda: router.in_flight == 1)
    async with contextlib.AsyncExitStack() as stack:
        request = terms(router, BULK, 3)
        reservations = [await stack.enter_async_context(router.admit(request, 3)) for _ in "abc"]

        async def page(number: int, index: int) -> None:
            await router.submit(blank(index), reservations[number], request)
            done.append(f"{'abc'[number]}{index}")

        pages = [asyncio.create_task(page(r, i)) for i in range(3) for r in range(3)]  # a0 b0 c0 a1 ...
        await asyncio.gather(blocker, *pages)
    assert done == ["blocker", "a0", "a1", "a2", "b0", "b1", "b2", "c0", "c1", "c2"]


async def test_a_request_that_cannot_finish_by_its_deadline_is_refused_at_admission(make_router):
    router = make_router(initial_page_s=2.0)
    # nothing measured yet: router.initial_page_s stands in, and refuses what it could not finish
    assert router.service.measured == 0
    assert router.estimate_s(router.lanes[FAST], Work(1, 3e5, 300)) == pytest.approx(2.0)
    # a retry cannot help a page that alone outlasts its timeout: it says so
    with pytest.raises(Overloaded, match="even on an idle engine it would take about 3.0 s; send a longer timeout"):
        async with router.admit(terms(router, FAST, deadline=Deadline.after(1.0)), 1):
            pass
    # alone on an idle engine it is held to the margin for the unseen too: 2.0 s x 1.5 > 2.5 s
    assert router.bound_s(router.lanes[FAST], Work(1, 3e5, 300)) == pytest.approx(2.0 * UNSEEN_FACTOR)
    with pytest.raises(Overloaded, match="about 3.0 s"):
        async with router.admit(terms(router, FAST, deadline=Deadline.after(2.5)), 1):
            pass
    async with router.admit(request := terms(router, FAST), 1, visual_tokens=300) as reservation:
        await router.submit(text_page(), reservation, request)
    assert router.service.measured == 1
    queued = [asyncio.create_task(run_tagged(router, BULK, f"b{i}", text_page(i), [])) for i in range(4)]
    await wait_until(lambda: router.in_flight == 1 and router.lanes[BULK].reserved == 3)
    bulk = router.lanes[BULK]
    # the pages queued ask what decoded pages do: the pixels the detector reads, their line units
    page = router.page_work(text_page())
    assert page.pixels == 736 * 992 and page.units > 50
    assert bulk.work_ahead(None).features() == pytest.approx((page + page + page).features())
    two = page + page

    def work() -> float:  # in shares of the engine's seconds: what is ahead, what is left of the page in it, its own
        return router.service.seconds(bulk.work_ahead(None)) + router.in_engine_s() + router.own_s(two)

    before = work()
    estimate = router.estimate_s(bulk, two, client="")  # the client's own page before does not slow it
    assert work() <= estimate <= before  # the page in the engine runs on meanwhile
    started = time.monotonic()
    with pytest.raises(Overloaded) as refused:
        async with router.admit(terms(router, BULK, 2, Deadline.after(estimate / 2)), 2, 600, two):
            pass
    assert time.monotonic() - started < 0.1  # at once, not after waiting
    problem = refused.value
    assert problem.status == 503 and problem.slug == "deadline-unmeetable"
    # admission holds it to the work ahead times its upper factor; the deadline's seconds left shrink
    wait = max(1, math.ceil(router.bound_s(bulk, two) - estimate / 2))
    assert int(problem.headers["Retry-After"]) in (wait - 1, wait, wait + 1)
    in_time = terms(router, BULK, 2, Deadline.after(estimate * 4))
    async with router.admit(in_time, 2, 600, two) as reservation:
        assert reservation.pending == 2
    await asyncio.gather(*queued)


async def test_a_request_only_the_margin_for_the_unseen_refuses_waits_for_pages_to_finish(make_router):
    """On a fresh router (nothing measured: 2 s a page, the margin for the unseen 1.5) a 1-page bulk
    request behind a page in the engine and three queued is priced at about 10 s and bound at about
    14; with 12 s left, without ``router.evidence_wait_s`` it is refused at once; with it, it
    waits (counting ahead of requests that arrive meanwhile) until the real pages, far faster than
    2 s, have finished and taught the model, and is then admitted. A request that even the bound
    without the margin overruns is refused at once."""
    for wait_s in (0.0, 5.0):
        router = make_router(initial_page_s=2.0, evidence_wait_s=wait_s)
        bulk = router.lanes[BULK]
        queued = [asyncio.create_task(run_tagged(router, BULK, f"b{i}", text_page(i), [])) for i in range(4)]
        await wait_until(lambda: router.in_flight == 1 and bulk.reserved == 3)  # noqa: B023 (awaited here)
        page = router.request_work([(640, 480)], 1, [239])
        estimate = router.estimate_s(bulk, page)
        assert router.service.warming and 8 < estimate <= 10
        without_margin = router._bound(estimate, page, router._pages_ahead(bulk, None, False), False)
        assert router.bound_s(bulk, page) > 12.5 > 12 > without_margin
        with pytest.raises(Overloaded, match="would be ahead of and in it"):
            async with router.admit(terms(router, BULK, deadline=Deadline.after(estimate / 2)), 1, work=page):
                pass  # hopeless even without the margin: at once, however long it may wait
        request = terms(router, BULK, deadline=Deadline.after(12))
        assert router.next_page_s() < 0.2 * 12  # a page is expected to finish within the wait
        started = time.monotonic()
        if not wait_s:
            with pytest.raises(Overloaded, match="would be ahead of and in it"):
                async with router.admit(request, 1, work=page):
                    pass
            assert time.monotonic() - started < AT_ONCE_S
        else:
            # the wait runs from arrival: one that arrived (was uploaded and previewed) that long ago has none left
            with pytest.raises(Overloaded, match="would be ahead of and in it"):
                async with router.admit(dataclasses.replace(request, arrived=started - wait_s), 1, work=page):
                    pass
            assert time.monotonic() - started < AT_ONCE_S
            admission = asyncio.create_task(router.admit(request, 1, work=page).__aenter__())
            await wait_until(lambda: router._awaiting)  # noqa: B023 (awaited here)
            # it counts ahead of a request that arrives now (both sides at one instant: a page may finish)
            assert router._work_ahead(bulk, None) == bulk.work_ahead(None) + page
            reservation = await admission
            waited = time.monotonic() - started
            assert reservation.pending == 1
            assert router.service.measured >= 1
            assert 0 < waited < 2.4 + AT_ONCE_S  # its share of the 12 s left, and no more
            assert not router._awaiting
            reservation.release(1)
        await asyncio.gather(*queued)


async def test_a_request_alone_on_a_fresh_idle_engine_is_held_to_the_margin_and_refused_at_once(make_router):
    """Alone on an idle engine a fresh router (2 s a page, the margin for the unseen 1.5) holds a
    1-page request to 3 s: with 2.5 s left it is refused, at once, though it may wait 5 s for
    evidence (no page is ahead of it to finish), both on entry (:meth:`check_held`) and at
    admission. The lone request once went without the margin, and a fresh gateway beside a CPU
    hog admitted a 2-page document of 22-px text that ran 55 s against its 45."""
    router = make_router(initial_page_s=2.0, evidence_wait_s=5.0)
    bulk = router.lanes[BULK]
    page = router.request_work([(640, 480)], 1, [239])
    assert router._pages_ahead(bulk, None, False) == 0 and router.estimate_s(bulk, page) == pytest.approx(2.0)
    assert router.bound_s(bulk, page) == pytest.approx(3.0)
    request = terms(router, BULK, deadline=Deadline.after(2.5))
    with pytest.raises(Overloaded, match="even on an idle engine it would take about 3.0 s"):
        router.check_held(request, 1, page, next(router._arrivals))
    started = time.monotonic()
    with pytest.raises(Overloaded, match="even on an idle engine it would take about 3.0 s"):
        async with router.admit(request, 1, work=page):
            pass
    assert time.monotonic() - started < 0.1
    async with router.admit(terms(router, BULK, deadline=Deadline.after(3.5)), 1, work=page) as reservation:
        assert reservation.pending == 1


def dense_page(index: int = 0) -> Page:
    """Phototest tiled 2 x 2 (1280 x 960): about 2 s in the engine on 2 cores."""
    image = np.tile(np.asarray(phototest()), (2, 2, 1))
    return Page(index=index, image=image, width=1280, height=960, visual_tokens=1200, line_units=line_units(image))


@pytest.mark.slow
async def test_a_wait_for_evidence_in_which_no_page_finishes_ends_refused(make_router):
    """The model's own count of the engine's progress is not evidence: behind dense pages that
    take about 2 s each, priced at 0.5 s (``router.initial_page_s``), a request that only the
    margin refuses waits (a fifth of its seconds left) while no page finishes, and is then
    refused on the bound it came with, however far the model thinks the engine got meanwhile. A
    disconnect that cancels a wait is counted in the wait's metric too."""
    from prometheus_client import REGISTRY

    def waits() -> float:
        return REGISTRY.get_sample_value("ocrserve_admission_evidence_wait_seconds_count", {"lane": BULK}) or 0.0

    router = make_router(initial_page_s=0.5, evidence_wait_s=5.0)
    bulk = router.lanes[BULK]
    queued = [asyncio.create_task(run_tagged(router, BULK, f"d{i}", dense_page(i), [])) for i in range(4)]
    await wait_until(lambda: router.in_flight == 1 and bulk.reserved == 3)
    page = router.request_work([(640, 480)], 1, [239])
    estimate = router.estimate_s(bulk, page)
    without_margin = router._bound(estimate, page, router._pages_ahead(bulk, None, False), False)
    bound = router.bound_s(bulk, page)
    left = (bound + without_margin) / 2  # only the margin refuses it
    before, started = waits(), time.monotonic()
    with pytest.raises(Overloaded, match="would be ahead of and in it") as refused:
        async with router.admit(terms(router, BULK, deadline=Deadline.after(left)), 1, work=page):
            pass
    waited = time.monotonic() - started
    assert router.service.measured == 0  # no page finished meanwhile
    assert 0.15 * left < waited < 0.2 * left + 0.1 and waits() == before + 1
    assert int(refused.value.headers["Retry-After"]) >= math.ceil(bound - left)
    # a wait cut short (the client went away) is counted as well; priced again: the page in the
    # engine has run on meanwhile
    estimate = router.estimate_s(bulk, page)
    left = (
        router.bound_s(bulk, page) + router._bound(estimate, page, router._pages_ahead(bulk, None, False), False)
    ) / 2
    admission = asyncio.create_task(
        router.admit(terms(router, BULK, deadline=Deadline.after(left)), 1, work=page).__aenter__()
    )
    await wait_until(lambda: router._awaiting)
    admission.cancel()
    with pytest.raises(asyncio.CancelledError):
        await admission
    assert waits() == before + 2 and not router._awaiting
    await asyncio.gather(*queued)


async def test_a_held_request_that_only_the_margin_refuses_is_refused_once_no_page_is_due_in_its_wait(make_router):
    """:meth:`check_held` (on entry to :meth:`held`, and again when the request's turn to be
    previewed comes) prices a request's least work without the margin for the unseen only while
    evidence may come in time: behind pages predicted (by the prior, ``router.initial_page_s``)
    to take 2 s each, the one in the engine due within the 5-s wait, a request that only the
    margin refuses goes on to its previews; behind one predicted to take 20 s it is refused now,
    rather than previewed and then refused after a wait in which no page could finish."""
    for initial_page_s, pages, refused in ((2.0, 10, False), (20.0, 1, True)):
        router = make_router(initial_page_s=initial_page_s, evidence_wait_s=5.0)
        bulk = router.lanes[BULK]
        queued = [asyncio.create_task(run_tagged(router, BULK, f"b{i}", text_page(i), [])) for i in range(pages)]
        await wait_until(lambda: router.in_flight == 1 and bulk.reserved == pages - 1)  # noqa: B023 (awaited here)
        least = router.request_work([(640, 480)], 1, [0.0])
        estimate = router.estimate_s(bulk, least)
        without_margin = router._bound(estimate, least, router._pages_ahead(bulk, None, False), False)
        bound = router.bound_s(bulk, least)
        assert without_margin < bound and (router.next_page_s() > 5.0) == refused
        request = terms(router, BULK, deadline=Deadline.after((bound + without_margin) / 2))
        if refused:
            with pytest.raises(Overloaded, match="would be ahead of and in it"):
                router.check_held(request, 1, least, next(router._arrivals))
        else:
            router.check_held(request, 1, least, next(router._arrivals))
        for task in queued:
            task.cancel()
        await asyncio.gather(*queued, return_exceptions=True)


async def test_one_clients_queue_delays_another_clients_page_by_about_one_page(make_router):
    """Client A queues 6 pages behind a busy engine, then client B sends one page: B's page goes
    next (start-time fair queueing over requests), not after all six."""
    router = make_router()
    done: list[str] = []
    blocker = asyncio.create_task(run_tagged(router, BULK, "blocker", text_page(), done))
    await wait_until(lambda: router.in_flight == 1)

    async def client_pages(client: str, pages: int) -> None:
        request = terms(router, BULK, pages, client=client)
        async with router.admit(request, pages) as reservation:

            async def one(index: int) -> None:
                await router.submit(blank(index), reservation, request)
                done.append(f"{client}{index}")

            await asyncio.gather(*(one(i) for i in range(pages)))

    a = asyncio.create_task(client_pages("a", 6))
    await wait_until(lambda: router.lanes[BULK].reserved == 6)
    b = asyncio.create_task(client_pages("b", 1))
    await asyncio.gather(blocker, a, b)
    # B's one-page request finishes (in virtual time) before A's six-page one: it goes next
    assert done == ["blocker", "b0", "a0", "a1", "a2", "a3", "a4", "a5"]


async def test_fair_share_counts_visual_tokens_and_the_queue_reports_its_cost(make_router):
    """With ``router.cost: visual_tokens`` (the default) a request's fair-queueing cost is its
    pages' visual tokens: client B's one small page (10 tokens) goes before client A's one large
    page (10,000 tokens) admitted before it; the lane's queued cost is what its queue holds."""
    router = make_router()
    done: list[str] = []
    blocker = asyncio.create_task(run_tagged(router, BULK, "blocker", text_page(), done))
    await wait_until(lambda: router.in_flight == 1)

    async def one_page(client: str, tokens: int) -> None:
        request = terms(router, BULK, client=client)
        async with router.admit(request, 1, visual_tokens=tokens) as reservation:
            await router.submit(dataclasses.replace(blank(), visual_tokens=tokens), reservation, request)
        done.append(client)

    large = asyncio.create_task(one_page("a", 10_000))
    await wait_until(lambda: router.lanes[BULK].queued_cost == 10_000)
    small = asyncio.create_task(one_page("b", 10))
    await wait_until(lambda: router.lanes[BULK].queued_cost == 10_010)
    await asyncio.gather(blocker, large, small)
    assert done == ["blocker", "b", "a"]
    assert router.lanes[BULK].queued_cost == 0


@pytest.mark.parametrize(("aging_s", "order"), [(0.0, ["s0", "s1", "s2", "doc"]), (0.05, ["doc", "s0", "s1", "s2"])])
async def test_aging_lets_a_fast_document_go_before_single_pages_queued_after_it(make_router, aging_s, order):
    """A fast document's page (priority 1) queued behind a running page goes after the single pages
    (priority 0) queued after it, under strict priority (which a steady stream of single pages
    turns into starvation); with ``fast.aging_s`` shorter than the running page's time it has waited
    long enough when the slot frees, and goes first."""
    router = make_router(fast={"burst_slots": 0, "aging_s": aging_s})
    done: list[str] = []
    blocker = asyncio.create_task(run_tagged(router, FAST, "blocker", text_page(), done))
    await wait_until(lambda: router.in_flight == 1)  # phototest: at least 0.2 s in the engine
    document = router.cfg.fast.priority + 1
    tasks = [asyncio.create_task(run_tagged(router, FAST, "doc", blank(), done, document))]
    await wait_until(lambda: len(router.policy) == 1)
    tasks += [asyncio.create_task(run_tagged(router, FAST, f"s{i}", blank(i), done)) for i in range(3)]
    await asyncio.gather(blocker, *tasks)
    assert done == ["blocker", *order]


async def test_documents_filling_the_fast_lane_do_not_shut_a_single_page_out(make_router):
    """Only pages that go before a request count against its queue bound: fast documents
    (priority 1) fill ``queue_pages``, and a single page (priority 0) is still admitted."""
    router = make_router(fast={"queue_pages": 4})
    async with router.admit(terms(router, FAST, 4, order=1), 4):
        with pytest.raises(Overloaded, match="holds 4 of 4 pages"):
            async with router.admit(terms(router, FAST, order=1), 1):
                pass
        async with router.admit(terms(router, FAST, order=0), 1) as reservation:
            assert router.lanes[FAST].reserved == 5 and router.lanes[FAST].ahead(0) == 1
            assert reservation.pending == 1


async def test_one_client_keeps_admission_order(make_router):
    router = make_router()
    done: list[str] = []
    blocker = asyncio.create_task(run_tagged(router, BULK, "blocker", text_page(), done))
    await wait_until(lambda: router.in_flight == 1)
    first = asyncio.create_task(run_tagged(router, BULK, "a0", blank(), done))
    await wait_until(lambda: router.lanes[BULK].reserved == 1)
    second = asyncio.create_task(run_tagged(router, BULK, "a1", blank(1), done))  # same (shared) client
    await asyncio.gather(blocker, first, second)
    assert done == ["blocker", "a0", "a1"]


async def test_admissions_are_accounted_against_their_estimate_and_deadline(make_router):
    from prometheus_client import REGISTRY

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name, {"lane": BULK}) or 0.0

    router = make_router()
    async with router.admit(request := terms(router, BULK), 1) as reservation:  # measure a page first
        await router.submit(text_page(), reservation, request)
    estimates = sample("ocrserve_admission_estimate_error_seconds_count")
    misses = sample("ocrserve_admitted_deadline_misses_total")
    request = terms(router, BULK, deadline=Deadline.after(30), client="x")
    async with router.admit(request, 1) as reservation:
        assert sample("ocrserve_lane_active_clients") == 1
        await router.submit(blank(), reservation, request)
    assert sample("ocrserve_lane_active_clients") == 0
    assert sample("ocrserve_admission_estimate_error_seconds_count") == estimates + 1
    async with router.admit(dataclasses.replace(terms(router, BULK), deadline=None), 1):
        pass  # room held and given back unused, as the jobs worker's every poll: nothing to account
    assert sample("ocrserve_admission_estimate_error_seconds_count") == estimates + 1
    assert sample("ocrserve_admitted_deadline_misses_total") == misses  # done in time
    seconds = router.estimate_s(router.lanes[BULK], router.request_work(None, 1))
    allowed = seconds * router.upper_factor() + 0.5  # what admission reckons, with room to spare
    async with router.admit(terms(router, BULK, deadline=Deadline.after(allowed), client="x"), 1):
        await asyncio.sleep(allowed + 0.1)  # admitted, then the request itself dawdles past its deadline
    assert sample("ocrserve_admitted_deadline_misses_total") == misses + 1


async def test_fifo_mode_keeps_arrival_order(make_router):
    router = make_router(mode="fifo")
    done: list[str] = []
    bulk = [asyncio.create_task(run_tagged(router, BULK, f"b{i}", text_page(i), done)) for i in range(3)]
    await wait_until(lambda: router.in_flight == 1)
    fast = [asyncio.create_task(run_tagged(router, FAST, f"f{i}", blank(i), done)) for i in range(2)]
    await asyncio.gather(*bulk, *fast)
    assert done == ["b0", "b1", "b2", "f0", "f1"]


async def test_full_lane_refused_with_littles_law_retry_after(make_router):
    router = make_router(fast={"queue_pages": 3})
    for i in range(6):  # give the lane a drain history
        async with router.admit(request := terms(router, FAST), 1) as reservation:
            await router.submit(blank(i), reservation, request)
    async with router.admit(terms(router, FAST, 3, order=0), 3):
        before = metrics.REJECTIONS.labels(FAST, "queue_full")._value.get()
        with pytest.raises(Overloaded) as refused:
            async with router.admit(terms(router, FAST), 1):
                pass
        lane = router.lanes[FAST]
        rate = lane.drain_rate(time.monotonic())
    problem = refused.value
    assert problem.status == 503 and problem.slug == "queue-full"
    assert rate > 0 and int(problem.headers["Retry-After"]) == max(1, math.ceil(3 / rate))
    assert metrics.REJECTIONS.labels(FAST, "queue_full")._value.get() == before + 1
    assert router.lanes[FAST].reserved == 0  # the reservation was returned


async def test_request_larger_than_the_lane_is_413_not_503(make_router):
    router = make_router(fast={"queue_pages": 3})
    with pytest.raises(PayloadTooLarge, match="router.fast.queue_pages=3"):
        async with router.admit(terms(router, FAST, 4), 4):
            pass


async def test_overload_status_configurable(make_router):
    router = make_router(overload_status=429, bulk={"queue_pages": 2})
    async with router.admit(terms(router, BULK, 2), 2):
        with pytest.raises(Overloaded) as refused:
            async with router.admit(terms(router, BULK), 1):
                pass
    assert refused.value.status == 429


async def test_retry_after_by_littles_law():
    assert retry_after_s(30, 2.0, 5.0) == 15  # L = 30 pages, lambda = 2 pages/s -> W = 15 s
    assert retry_after_s(30, 0.0, 5.0) == 6  # no lane history: the engine's overall rate
    assert retry_after_s(1, 50.0, 0.0) == 1  # never below a second


async def test_deadline_passed_while_queued_never_reaches_engine(make_router):
    router = make_router(fast={"burst_slots": 0})
    engine_pages = metrics.ENGINE_PAGES.labels(FAST)._value.get()
    deadline_drops = metrics.REJECTIONS.labels(FAST, "deadline")._value.get()
    async with router.admit(bulk := terms(router, BULK), 1) as busy:
        slow = asyncio.create_task(router.submit(text_page(), busy, bulk))
        await wait_until(lambda: router.in_flight == 1)
        async with router.admit(terms(router, FAST), 1) as reservation:
            with pytest.raises(DeadlinePassed):
                await router.submit(blank(), reservation, terms(router, FAST, deadline=Deadline.after(0.05)))
        await slow
    assert metrics.ENGINE_PAGES.labels(FAST)._value.get() == engine_pages
    assert metrics.REJECTIONS.labels(FAST, "deadline")._value.get() == deadline_drops + 1


async def test_cancelled_request_drops_its_queued_pages(make_router):
    router = make_router()
    engine_pages = metrics.ENGINE_PAGES.labels(BULK)._value.get()
    cancelled = metrics.REJECTIONS.labels(BULK, "cancelled")._value.get()

    async def document():
        async with router.admit(request := terms(router, BULK, 4), 4) as reservation:
            await asyncio.gather(*(router.submit(text_page(i), reservation, request) for i in range(4)))

    aborted = metrics.ABORTED_PAGES.labels(BULK, "cancelled")._value.get()
    request = asyncio.create_task(document())
    await wait_until(lambda: router.in_flight == 1)
    request.cancel()  # what a client disconnect does to its request
    await asyncio.gather(request, return_exceptions=True)
    await wait_until(lambda: router.in_flight == 0)
    assert metrics.ENGINE_PAGES.labels(BULK)._value.get() == engine_pages + 1  # only the page already running,
    assert metrics.ABORTED_PAGES.labels(BULK, "cancelled")._value.get() == aborted + 1  # which was aborted
    assert metrics.REJECTIONS.labels(BULK, "cancelled")._value.get() == cancelled + 3
    assert router.lanes[BULK].reserved == 0 and len(router.policy) == 0


async def test_job_priority_overtakes_queued_pages(make_router):
    router = make_router()  # capacity 1: dispatch order equals completion order
    low, high = (Priority.of_job(p, 9, router.cfg.bulk.priority) for p in (0, 9))
    assert (low, high) == (19, 10)  # lower runs sooner
    done: list[str] = []
    lows = [asyncio.create_task(run_tagged(router, BULK, f"low{i}", text_page(i), done, low)) for i in range(3)]
    await wait_until(lambda: router.in_flight == 1 and len(router.policy) == 2)
    highs = [asyncio.create_task(run_tagged(router, BULK, f"high{i}", blank(i), done, high)) for i in range(2)]
    await asyncio.gather(*lows, *highs)
    assert done == ["low0", "high0", "high1", "low1", "low2"]


async def test_deadline_passed_in_the_engine_aborts_the_page(make_router):
    router = make_router()
    aborted = metrics.ABORTED_PAGES.labels(FAST, "deadline")._value.get()
    async with router.admit(terms(router, FAST), 1) as reservation:
        large = Page(
            index=0, image=np.tile(np.asarray(phototest()), (3, 3, 1)), width=1920, height=1440, visual_tokens=900
        )
        late = terms(router, FAST, deadline=Deadline.after(0.1))
        submitted = asyncio.create_task(router.submit(large, reservation, late))
        await wait_until(lambda: router.in_flight == 1)  # dispatched before its deadline
        with pytest.raises(DeadlinePassed, match="in the engine"):
            await submitted
    await wait_until(lambda: router.in_flight == 0)
    assert metrics.ABORTED_PAGES.labels(FAST, "deadline")._value.get() == aborted + 1


async def test_failing_page_fails_alone_and_teaches_no_page_time(make_router):
    router = make_router(slot_overcommit=1.0)
    broken = Page(index=1, image=np.zeros((0, 0, 3), np.uint8), width=1, height=1, visual_tokens=0)
    async with router.admit(request := terms(router, FAST, 3), 3) as reservation:
        outcomes = await asyncio.gather(
            router.submit(text_page(0), reservation, request),
            router.submit(broken, reservation, request),
            router.submit(blank(2), reservation, request),
            return_exceptions=True,
        )
    assert outcomes[0].text.startswith("This is a lot of 12 point text")
    assert isinstance(outcomes[1], PageError)
    assert outcomes[2].index == 2 and outcomes[2].text == ""
    # the engine's error came at once: it says nothing of what a page takes (vLLM's 400 for a page
    # over max_model_len taught a real gateway that 16.8 Mpx take 0.1 s)
    assert router.service.measured == 2


async def test_pages_of_a_request_side_by_side_in_the_engine_are_learned_together(make_router):
    """A blank page leaves the engine long before the text page of its request beside it: it is
    held, and no evidence is given, until the text page leaves; then both are learned at once, at
    their summed share split by their predictions (the prior's: equal halves)."""
    router = make_router(slot_overcommit=1.0, initial_page_s=1.0)
    evidence = router._evidence
    async with router.admit(request := terms(router, BULK, 2), 2) as reservation:
        empty = asyncio.create_task(router.submit(blank(1), reservation, request))
        await wait_until(lambda: router.in_flight == 1)
        text = asyncio.create_task(router.submit(text_page(0), reservation, request))
        await wait_until(lambda: router.in_flight == 2)
        await empty
        await wait_until(lambda: router.in_flight == 1)
        assert not text.done() and router.service.measured == 0 and not evidence.is_set()
        ((blank_work, blank_share),) = router._unlearned[(reservation, False)]
        await text
    await wait_until(lambda: router.service.measured == 2)
    assert evidence.is_set() and not router._unlearned
    # fitted to the same seconds, the two pages are priced alike, each above the blank page's own share
    blank_s, text_s = (router.service.seconds(work) for work in (blank_work, router.page_work(text_page(0))))
    assert blank_s == pytest.approx(text_s, rel=0.05) and blank_s > 1.2 * blank_share


@pytest.mark.slow
async def test_calibration_teaches_the_service_time_model_what_text_costs(make_router):
    """Three synthetic pages at start (a line, a full letter page, the letter page with one line)
    give the admission measured page times before any client's page: a letter page full of text
    is estimated above the same page with one line, as it takes longer."""
    router = make_router()
    strip, letter, sparse = calibration_pages(PreprocessConfig(max_side=2000, factor=1))
    assert strip.line_units <= sparse.line_units < letter.line_units / 10
    await router.calibrate([strip, letter, sparse])
    assert router.service.measured == router.idle.measured == router.idle_background.measured == 3
    dense_s, sparse_s = (router.service.seconds(router.page_work(page)) for page in (letter, sparse))
    assert dense_s > 1.5 * sparse_s
    assert router.mean_work.pages == 1 and router.mean_work.units > sparse.line_units
    # the embedded engine runs background pages (documents') on one thread a stage: the service
    # model learned them as such, the idle one as interactive pages on every core (2 cores: the
    # strip 1.40 s a page two side by side as background pages, 0.82 s alone as an interactive one)
    assert router.engine.background_apart
    strip_work = router.page_work(strip)
    assert router.service.seconds(strip_work) > 1.2 * router.idle.seconds(strip_work)
    # single pages get a model of their own, learned from them alone; documents' pages get their
    # share of the engine beside them
    assert router.interactive_service is not router.service and router.interactive_service.measured == 3
    assert router.clock.background_share == BACKGROUND_SHARE
    single, document = terms(router, FAST), terms(router, FAST, 2)
    assert single.bursts and not document.bursts
    for request, pages in ((single, [strip]), (document, [sparse, sparse])):
        async with router.admit(request, len(pages)) as reservation:
            await asyncio.gather(*(router.submit(page, reservation, request) for page in pages))
    assert (router.interactive_service.measured, router.service.measured) == (4, 5)


async def test_the_fast_lane_refuses_what_would_miss_its_latency_target_unless_the_client_set_a_timeout(
    engine, make_router
):
    """Without its own ``timeout`` a fast request is admitted only within the lane's latency target
    (``router.fast.latency_target_s``), by the estimate times the admission's upper factor (1.5
    while nothing was measured); a client that sends a timeout gets what it asked for."""
    router = make_router(initial_page_s=2.0, fast={"latency_target_s": 1.5})
    fast = router.lanes[FAST]
    # nothing ahead: the bound is the estimate times the margin for the unseen (1.5 while nothing was measured)
    page = Work(1, 3e5, 300)
    assert router.upper_factor() == 1.5 and router.estimate_s(fast, page) == 2.0 and router.bound_s(fast, page) == 3.0
    with pytest.raises(Overloaded) as refused:
        async with router.admit(terms(router, FAST), 1, visual_tokens=300):
            pass
    problem = refused.value
    assert problem.status == 503 and problem.slug == "latency-target" and problem.headers["Retry-After"] == "2"
    assert "above its latency target of 1.5 s" in str(problem)
    async with router.admit(terms(router, FAST, deadline=Deadline.after(30)), 1, visual_tokens=300) as reservation:
        assert reservation.pending == 1
    # the target runs from the request's arrival: 1 s spent before admission leaves 0.5 s for a bound of 1.5 s
    router = make_router(initial_page_s=1.0, fast={"latency_target_s": 1.5})
    async with router.admit(terms(router, FAST), 1, visual_tokens=300):
        pass
    late_comer = dataclasses.replace(terms(router, FAST), arrived=time.monotonic() - 1.0)
    with pytest.raises(Overloaded, match="in about 2.5 s, above its latency target of 1.5 s"):
        async with router.admit(late_comer, 1, visual_tokens=300):
            pass
    # with latency_target_multiple the target is that many times the request's time on an idle
    # engine (the calibration pages' fit; here none: the finished pages')
    settings = {"initial_page_s": 2.0, "fast": {"latency_target_multiple": 5}}
    multiple = Router(engine, RouterConfig.model_validate(settings))
    assert multiple.has_latency_target and multiple.latency_target_s(page) == pytest.approx(5 * 2.0)
    assert Router(engine, RouterConfig()).has_latency_target  # 5 x by default
    off = RouterConfig.model_validate({"fast": {"latency_target_multiple": 0}})
    assert not Router(engine, off).has_latency_target


@pytest.mark.slow
async def test_the_fast_lane_leaves_room_below_its_latency_target_for_what_its_bound_misses(make_router):
    """Fast requests held to the latency target that finish later than the bound they were admitted
    on (here: their clients hold them 0.8 s past their pages) teach admission to leave that much
    below the target, once 16 have: a request that arrived 2.4 s ago fits a 3 s target with a
    blank page's bound before, and is refused after."""
    router = make_router(initial_page_s=1.0, fast={"latency_target_s": 3.0})
    work = router.request_work([(64, 64)], 1, [0])

    async def one(held_s: float) -> None:
        request = terms(router, FAST)
        async with router.admit(request, 1, work=work) as reservation:
            await router.submit(blank(), reservation, request)
            await asyncio.sleep(held_s)

    def late_comer() -> Terms:
        return dataclasses.replace(terms(router, FAST), arrived=time.monotonic() - 2.4)

    for _ in range(20):
        await one(0.0)
    assert router.latency_headroom_s() < 0.3
    async with router.admit(late_comer(), 1, work=work):
        pass
    for _ in range(16):
        await one(0.8)
    assert 0.6 < router.latency_headroom_s() < 2.0
    with pytest.raises(Overloaded, match=r"in about ([3-9]\.[0-9]) s, above its latency target of 3\.0 s"):
        async with router.admit(late_comer(), 1, work=work):
            pass


async def test_a_single_page_is_not_priced_by_the_over_run_of_bulk_pages_it_overtakes(make_router):
    """A bulk page in the engine far past its prediction (a dense page priced at 0.02 s) says the
    machine is slow to a request that waits for it, not to a single page, which overtakes it: the
    single page is still admitted within a 0.3 s latency target, where the bulk page's over-run
    (the engine's :meth:`Router.slowdown`) would price it at 0.02 s x 10 and more."""
    router = make_router(initial_page_s=0.02, fast={"latency_target_s": 0.3})
    bulk = asyncio.create_task(run_tagged(router, BULK, "dense", dense_page(), []))
    await wait_until(lambda: router.in_flight == 1)
    await asyncio.sleep(0.5)
    single = router.request_work([(64, 64)], 1, [0])
    assert router.slowdown() > 10 and router.slowdown(bursting=True) == 1.0
    request = terms(router, FAST)
    assert request.bursts
    async with router.admit(request, 1, work=single) as reservation:
        assert reservation.pending == 1
    await bulk


@pytest.mark.slow
async def test_a_fast_document_finishes_beside_a_steady_stream_of_single_pages(make_router):
    """Two clients send single pages back to back (one in the engine, one in the burst slot, one
    queued at all times) while a 2-page fast document waits one step after them in the lane: the
    lane's aging brings its pages to the engine, where every fast page is interactive, so it is
    answered, not held until its deadline (a strict gate held such documents to 504)."""
    router = make_router(fast={"aging_s": 0.5})
    stop = asyncio.Event()
    singles: list[str] = []

    async def stream(client: str) -> None:
        index = 0
        while not stop.is_set():
            await run_tagged(router, FAST, client, text_page(index), singles)
            index += 1

    streams = [asyncio.create_task(stream(client)) for client in "ab"]
    await wait_until(lambda: len(singles) >= 2)
    document = terms(router, FAST, 2, deadline=Deadline.after(60))
    assert document.order == 1 and not document.bursts
    started = time.monotonic()
    async with router.admit(document, 2) as reservation:
        pages = await asyncio.gather(*(router.submit(text_page(i), reservation, document) for i in range(2)))
    took = time.monotonic() - started
    stop.set()
    await asyncio.gather(*streams)
    assert [p.text[:12] for p in pages] == ["This is a lo"] * 2
    assert took < 30, took


async def test_counting_a_pages_line_units_takes_a_core_from_the_background_pages(make_router):
    """While the gateway counts line units (:meth:`PagePipeline.line_units`, a thread above the
    engine's background pages), the share clock gives a background page in the engine the cores
    the count leaves it (``1 - 1 / cores`` of the wall seconds), where the engine runs the classes
    apart (:data:`BACKGROUND_SHARE` set, as :meth:`Router.calibrate` sets it)."""
    router = make_router()
    router.clock.background_share = BACKGROUND_SHARE
    preprocessor = Preprocessor(PreprocessConfig(workers=1, background_workers=1))
    image = np.asarray(phototest().convert("L"))
    try:
        entered = router.clock.enter(interactive=False)
        started = time.monotonic()
        [units] = await PagePipeline(router, preprocessor).line_units([image], EngineClass.BACKGROUND)
        wall = time.monotonic() - started
        share = router.clock.leave(entered, interactive=False)
    finally:
        preprocessor.close()
    assert units == pytest.approx(line_units(image))
    kept = max(0.0, 1 - 1 / router.clock.cores)
    assert share == pytest.approx(wall * kept, abs=0.05 * wall + 0.01)
