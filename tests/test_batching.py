"""The engine's priority primitives and the recognition batcher, on the real recognition model."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from ocrserve.alarm import PrioritySemaphore
from ocrserve.config import EngineConfig
from ocrserve.engines.base import PageError
from ocrserve.engines.onnx import OnnxEngine
from ocrserve.engines.stage_scheduler import ClassGate, GatePass, RecBatcher
from ocrserve.work import EngineClass
from tests.test_engine import load_page


async def test_priority_semaphore_serves_most_urgent_first():
    lock = PrioritySemaphore(1)
    order: list[str] = []

    async def take(name: str, priority: int):
        async with lock.hold(priority):
            order.append(name)
            await asyncio.sleep(0.01)

    async with lock.hold(5):  # hold it while three wait
        waiters = [asyncio.create_task(take(n, p)) for n, p in (("bulk-a", 10), ("fast", 0), ("bulk-b", 10))]
        await asyncio.sleep(0.01)
    await asyncio.gather(*waiters)
    assert order == ["fast", "bulk-a", "bulk-b"]


async def test_cancelled_waiter_does_not_keep_the_permit():
    lock = PrioritySemaphore(1)
    async with lock.hold(0):
        waiter = asyncio.create_task(lock.hold(0).__aenter__())
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
    async with lock.hold(0):  # free again
        pass


def background_pass() -> GatePass:
    """A pass of a background page (no gate: the batcher's own, which nothing else enters)."""
    return GatePass(EngineClass.BACKGROUND)


@pytest.fixture
async def crops():
    """Real text-line crops of tesseract's phototest page, from the engine's detector."""
    engine = OnnxEngine(EngineConfig())
    await engine.start()
    detection = engine._detect(load_page("phototest.tif").image, 0, True)
    yield engine, detection.crops
    await engine.close()


async def test_urgent_crops_run_before_queued_bulk_runs(crops):
    engine, lines = crops
    calls: list[int] = []

    def recognize(batch, priority):
        calls.append(len(batch))
        return engine._recognize(batch, priority)

    batcher = RecBatcher(recognize, max_batch_size=64, max_wait_ms=0, rec_batch_num=2)
    batcher.start()
    try:
        bulk = asyncio.create_task(batcher.submit(lines * 2, background_pass()))  # 16 crops: 8 runs of 2
        await asyncio.sleep(0)
        while not calls:
            await asyncio.sleep(0.001)
        urgent = await batcher.submit(lines[:1], GatePass(EngineClass.INTERACTIVE))
        runs_before_urgent = len(calls) - 1
        bulk_texts = await bulk
    finally:
        await batcher.close()
    assert urgent[0][0].startswith("This is a lot of 12 point text")
    assert runs_before_urgent <= 2  # it waited for at most the bulk run in progress, not all 8
    assert [t for t, _ in bulk_texts[:8]] == [t for t, _ in bulk_texts[8:]]


async def test_a_crop_that_breaks_fails_only_its_page(crops):
    engine, lines = crops
    batcher = RecBatcher(engine._recognize, max_batch_size=64, max_wait_ms=50, rec_batch_num=6)
    batcher.start()
    try:
        broken = np.zeros((0, 10, 3), np.uint8)
        submitted = (batcher.submit(lines, background_pass()), batcher.submit([broken], background_pass()))
        outcomes = await asyncio.gather(*submitted, return_exceptions=True)
    finally:
        await batcher.close()
    assert outcomes[0][0][0].startswith("This is a lot of 12 point text")
    assert isinstance(outcomes[1], PageError)


async def test_bulk_runs_pause_while_an_urgent_page_is_in_the_engine(crops):
    engine, lines = crops
    gate = ClassGate()  # no aging: strict
    batcher = RecBatcher(engine._recognize, max_batch_size=64, max_wait_ms=0, rec_batch_num=6, gate=gate)
    batcher.start()
    try:
        async with gate.entered(EngineClass.BACKGROUND) as background:
            async with gate.entered(EngineClass.INTERACTIVE):  # an interactive page, still in detection
                bulk = asyncio.create_task(batcher.submit(lines, background))
                await asyncio.sleep(0.3)
                assert not bulk.done()  # its runs wait
            texts = await asyncio.wait_for(bulk, 30)  # and go once the page has left
    finally:
        await batcher.close()
    assert texts[0][0].startswith("This is a lot of 12 point text")


async def test_an_aged_bulk_page_runs_beside_a_steady_interactive_page_on_its_own_threads(crops):
    """With aging, a background page's run does not wait for interactive pages to leave the
    engine: once it has been in the engine ``aging_s`` it runs beside them, but as background, on
    the background threads and sessions, in a group of its own: the interactive page's run never
    waits behind it."""
    engine, lines = crops
    gate = ClassGate(aging_s=0.2)
    groups: list[tuple[int, str]] = []

    def recognize(batch, engine_class):
        groups.append((engine_class, threading.current_thread().name.rsplit("_", 1)[0]))
        return engine._recognize(batch, engine_class)

    batcher = RecBatcher(recognize, max_batch_size=64, max_wait_ms=0, rec_batch_num=64, gate=gate)
    batcher.start()
    try:
        # the interactive page stays in the engine throughout
        entered = gate.entered(EngineClass.INTERACTIVE), gate.entered(EngineClass.BACKGROUND)
        async with entered[0] as interactive, entered[1] as background:
            assert not gate.clear_for(background)
            await asyncio.sleep(0.25)
            assert gate.clear_for(background) and background.engine_class is EngineClass.BACKGROUND
            both = await asyncio.gather(batcher.submit(lines, background), batcher.submit(lines, interactive))
    finally:
        await batcher.close()
    assert sorted(groups) == [(EngineClass.INTERACTIVE, "ocrserve-rec"), (EngineClass.BACKGROUND, "ocrserve-bg-rec")]
    assert both[0] == both[1] and both[0][0][0].startswith("This is a lot of 12 point text")


async def test_the_gate_lets_a_waiting_background_page_go_when_it_ages():
    gate = ClassGate(aging_s=0.1)
    async with gate.entered(EngineClass.INTERACTIVE), gate.entered(EngineClass.BACKGROUND) as background:
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(gate.turn(background), 5)  # nobody leaves: it goes by aging alone
        waited = asyncio.get_running_loop().time() - started
    assert 0.05 < waited < 1.0, waited
    strict = ClassGate()
    async with strict.entered(EngineClass.INTERACTIVE), strict.entered(EngineClass.BACKGROUND) as background:
        assert strict.ages_in(background) is None
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(strict.turn(background), 0.2)


async def test_workers_run_that_many_groups_at_once(crops):
    engine, lines = crops
    both_running = threading.Barrier(2, timeout=30)  # passed only while two runs are in progress together

    def recognize(batch, priority):
        both_running.wait()
        return engine._recognize(batch, priority)

    batcher = RecBatcher(recognize, max_batch_size=64, max_wait_ms=0, rec_batch_num=len(lines), workers=2)
    batcher.start()
    try:
        texts = await asyncio.wait_for(batcher.submit(lines * 2, background_pass()), 60)  # 2 runs of the lines
    finally:
        await batcher.close()
    assert not both_running.broken
    assert [t for t, _ in texts[: len(lines)]] == [t for t, _ in texts[len(lines) :]]
    assert texts[0][0].startswith("This is a lot of 12 point text")
