"""The adaptive in-flight limit (issue 13, part 4) on an engine whose latency the test controls.

``KneeEngine`` is the one stand-in here, as the issue asks: a page takes ``base`` seconds while at
most ``knee`` pages run at once, and longer beyond (they queue inside it), so the test can move the
point where the engine stops keeping up and watch the router's limit follow. Beyond the knee a
page's time grows with the square of the pages running, so that a queued page takes many times the
floor even where the event loop adds tens of milliseconds to every page (a busy CI machine).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import REGISTRY

from ocrserve.config import RouterConfig
from ocrserve.engines.base import Engine
from ocrserve.latency_limit import LatencyLimit
from ocrserve.pages import Page, PageResult
from ocrserve.router import Router
from ocrserve.scheduling import BULK, resolve
from ocrserve.work import WorkItem


class KneeEngine(Engine):
    """Pages take ``base`` s up to ``knee`` at once, ``base x (running / knee)^2`` beyond."""

    def __init__(self, slots: int, base: float, knee: int):
        super().__init__()
        self._slots, self.base, self.knee = slots, base, knee
        self.model, self.ready, self.running, self.most = "knee", True, 0, 0

    @property
    def slots(self) -> int:
        return self._slots

    async def start(self) -> None:
        self.ready = True

    async def close(self) -> None:
        self.ready = False

    async def ocr_page(self, page: Page, *, priority: int = 0, deadline=None) -> PageResult:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.base * max(1.0, self.running / self.knee) ** 2)
        finally:
            self.running -= 1
        return PageResult(index=page.index, width=page.width, height=page.height, text="")


def page(index: int) -> Page:
    return Page(index=index, image=np.zeros((8, 8, 3), np.uint8), width=8, height=8, visual_tokens=1)


async def run_pages(router: Router, count: int) -> None:
    terms = resolve(WorkItem(lane=BULK), router.cfg, count)
    async with router.admit(terms, count) as reservation:
        await asyncio.gather(*(router.submit(page(i), reservation, terms) for i in range(count)))


@pytest.mark.asyncio
async def test_the_limit_shrinks_when_pages_queue_in_the_engine_and_grows_when_they_stop():
    engine = KneeEngine(slots=16, base=0.02, knee=4)
    # the prior near the engine's page (not the default 1 s): 200 pages priced at 200 s, times the
    # margin for the unseen, would not fit the bulk lane's default deadline
    settings = {"concurrency": "adaptive", "bulk": {"queue_pages": 400}, "initial_page_s": 0.05}
    router = Router(engine, RouterConfig.model_validate(settings))
    router.start()
    try:
        assert router.limit == 16  # starts at the planned slots x overcommit
        await run_pages(router, 200)
        shrunk = router.limit
        assert 2 <= shrunk <= 9  # pages beyond ~1.4 x knee took over twice their fastest time
        assert REGISTRY.get_sample_value("ocrserve_engine_concurrency_limit") == shrunk
        engine.knee = 16  # the engine keeps up with all 16 now
        await run_pages(router, 300)
        assert router.limit >= 13 > shrunk
    finally:
        await router.close()


@pytest.mark.asyncio
async def test_a_fixed_router_keeps_its_capacity():
    engine = KneeEngine(slots=8, base=0.005, knee=2)
    router = Router(engine, RouterConfig())
    router.start()
    try:
        await run_pages(router, 40)
        assert router.limiter is None and router.limit == 8 and engine.most == 8
    finally:
        await router.close()


def test_limit_arithmetic():
    limit = LatencyLimit(maximum=10, initial=4)
    limit.record(1.0)  # the floor: unqueued, +1/4
    assert limit.value == pytest.approx(4.25)
    limit.record(1.9)  # within 2 x floor
    assert limit.value == pytest.approx(4.25 + 1 / 4.25)
    limit.record(5.0)  # queued: x0.9
    assert limit.value == pytest.approx((4.25 + 1 / 4.25) * 0.9)
    for _ in range(100):
        limit.record(5.0)
    assert limit.limit == 1  # never below one page
    for _ in range(1000):
        limit.record(1.0)
    assert limit.limit == 10  # never above the maximum
