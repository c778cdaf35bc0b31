"""The embedded ONNX engine, loaded from the models inside the rapidocr wheel."""

from __future__ import annotations

import asyncio
import os
import threading

import numpy as np
import pytest

from ocrserve.config import EngineConfig, OnnxEngineConfig, PreprocessConfig
from ocrserve.engines.base import PageError
from ocrserve.engines.onnx import OnnxEngine
from ocrserve.evaluation import bag_f1
from ocrserve.pages import Page
from ocrserve.preprocess import decode_pages, inspect_document
from ocrserve.work import EngineClass
from tests.conftest import DATA, ground_truth

CFG = PreprocessConfig(factor=32, max_side=2000, max_pixels=4_000_000)


def load_page(name: str) -> Page:
    data = (DATA / name).read_bytes()
    return decode_pages(data, inspect_document(data, CFG), [0], CFG)[0]


async def started(**onnx) -> OnnxEngine:
    eng = OnnxEngine(EngineConfig(onnx=OnnxEngineConfig(**onnx)))
    await eng.start()
    return eng


@pytest.fixture
async def engine():
    eng = await started(det_workers=2)
    yield eng
    await eng.close()


async def test_ready_after_warm_up_with_declared_slots(engine):
    assert engine.ready and engine.slots == 4
    assert engine.describe()["id"] == "rapidocr/PP-OCRv6-small"


async def test_concurrent_pages_share_recognition_batches():
    # phototest has 8 text lines and the TIFF's first page 4: a 12-crop batch fills only with both
    # pages, and the long max_wait_ms makes the first page's crops wait for the second's.
    engine = await started(det_workers=2, max_batch_size=12, max_wait_ms=60_000)
    try:
        pages = [load_page("phototest.tif"), load_page("testTIFF_multipage.tif")]
        together = await asyncio.gather(*(engine.ocr_page(p) for p in pages))
    finally:
        await engine.close()
    assert [len(r.lines) for r in together] == [8, 4]
    assert engine.batch_sizes == [12]  # one recognition batch held both pages' crops
    assert bag_f1(together[0].text, ground_truth("phototest.tif")) > 0.9
    assert together[1].text == "Multipage\nTIFF\nExample\nPage 1"


async def test_blank_page_gives_no_lines(engine):
    blank = Page(index=3, image=np.full((256, 256, 3), 255, np.uint8), width=512, height=512, visual_tokens=64)
    result = await engine.ocr_page(blank)
    assert (result.index, result.width, result.text, result.lines) == (3, 512, "", [])


async def test_failing_page_fails_alone(engine):
    broken = Page(index=0, image=np.zeros((0, 0, 3), np.uint8), width=1, height=1, visual_tokens=0)
    good = load_page("phototest.tif")
    outcomes = await engine.ocr_pages([broken, good])
    assert isinstance(outcomes[0], PageError)
    assert outcomes[1].text.startswith("This is a lot of 12 point text")


@pytest.mark.parametrize("scheduling", ["idle", "nice"])
async def test_bulk_pages_run_on_lower_priority_threads(scheduling):
    """Detection and recognition of bulk pages run on threads of a lower priority
    (``engine.onnx.background_scheduling``): SCHED_IDLE, or nice +10 (``background_nice``); those
    of interactive pages keep the process's policy and nice value. No aging (``aging_s`` 0): on a
    busy machine a background page in the engine for 2 s would run its next stage as interactive."""
    engine = await started(det_workers=2, aging_s=0.0, background_scheduling=scheduling)
    seen: set[tuple[str, int, int, int]] = set()
    detect, recognize = engine._detect, engine._recognize

    def priority() -> tuple[int, int]:
        return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def detecting(image, engine_class, orientation):
        seen.add(("det", engine_class, *priority()))
        return detect(image, engine_class, orientation)

    def recognizing(crops, engine_class):
        seen.add(("rec", engine_class, *priority()))
        return recognize(crops, engine_class)

    engine._detect, engine._batcher._recognize = detecting, recognizing
    page = load_page("phototest.tif")
    background, interactive = EngineClass.BACKGROUND, EngineClass.INTERACTIVE
    bulk = await engine.ocr_page(page, priority=background)
    fast = await engine.ocr_page(page, priority=interactive)
    assert bulk.text == fast.text and bulk.text.startswith("This is a lot of 12 point text")
    await engine.close()
    policy, nice = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, os.getpid())
    low = (os.SCHED_IDLE, nice) if scheduling == "idle" else (policy, min(nice + 10, 19))
    assert seen == {
        ("det", background, *low),
        ("rec", background, *low),
        ("det", interactive, policy, nice),
        ("rec", interactive, policy, nice),
    }


async def test_one_set_of_sessions_where_both_would_be_alike():
    """With ``background_threads`` equal to ``intra_op_num_threads`` (batch's actors: 0, every core)
    bulk and interactive pages run on the same sessions, built once, and read the same; with the
    default one thread per bulk stage they have sessions of their own (and admission times the
    calibration pages in both classes)."""
    alike = await started(background_threads=0)
    default = await started()
    try:
        page = load_page("phototest.tif")
        bulk = await alike.ocr_page(page, priority=EngineClass.BACKGROUND)
        interactive = await alike.ocr_page(page, priority=EngineClass.INTERACTIVE)
        assert bulk.text == interactive.text and bulk.text.startswith("This is a lot of 12 point text")
        assert alike._stages(5).det.session.session is alike._stages(0).det.session.session
        assert default._stages(5).det.session.session is not default._stages(0).det.session.session
        assert default.background_apart and not alike.background_apart
    finally:
        await alike.close()
        await default.close()
