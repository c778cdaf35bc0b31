"""Hostile documents cost bounded memory and time (issue 10, parts 1 and 2).

Every bomb is built here from a small header or a compressed stream, never kept as a large file:
a 16-bit and an RGB PNG of 12000 x 12000 (280 and 420 KB), a WebP whose header declares
16383 x 9000 (44 bytes), and a PDF whose 190 KB content stream inflates to 100 M ``q`` operators.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from ocrserve.config import PreprocessConfig
from ocrserve.errors import PayloadTooLarge, PoisonDocument, ProblemError
from ocrserve.preprocess import DecodeFailure, Preprocessor, inspect_document
from ocrserve.preprocess.pool import MIB, resident_mb
from tests import samples
from tests.conftest import DATA
from tests.jobs_util import job_gateway, wait_job

LIMIT_MB = 1024
CFG = PreprocessConfig(workers=1, worker_memory_mb=LIMIT_MB, worker_recycle_mb=LIMIT_MB, page_timeout_s=10)
PHOTOTEST = (DATA / "phototest.tif").read_bytes()


def peak_mb(pid: int) -> float:
    """The high-water mark of process ``pid``'s resident memory, MiB (``VmHWM``)."""
    with open(f"/proc/{pid}/status") as fh:
        (line,) = [line for line in fh if line.startswith("VmHWM")]
    return int(line.split()[1]) / 1024


async def decode(preprocessor: Preprocessor, data: bytes) -> list:
    info = await preprocessor.inspect(data)
    return [p async for chunk in preprocessor.pages(data, info, range(info.page_count)) for p in chunk]


@pytest.fixture
async def preprocessor(request):
    pre = Preprocessor(CFG.model_copy(update=getattr(request, "param", {})))
    await pre.warm_up()
    yield pre
    pre.close()


@pytest.mark.parametrize(
    ("bomb", "decoded_mb"),
    [(samples.blank_png(12000, 12000, bit_depth=16), 275), (samples.blank_png(12000, 12000, color_type=2), 549)],
    ids=["16-bit-gray", "rgb"],
)
async def test_large_pages_within_the_limits_cost_their_decoded_size_once(preprocessor, bomb, decoded_mb):
    """A 12000 x 12000 page decodes with one copy of its pixels and hands the memory back after
    (3.6 GB in float64 copies for the 16-bit one, 1.4 GB for the RGB one; issue 10)."""
    pid = preprocessor.worker_pids()[0]  # the interactive pool's process, which decodes at priority 0
    (page,) = await decode(preprocessor, bomb)
    assert not isinstance(page, DecodeFailure) and page.image.shape == (980, 980, 3)
    print(f"decoded {decoded_mb} MiB, worker peak {peak_mb(pid):.0f} MiB, then {resident_mb(pid):.0f} MiB")
    assert peak_mb(pid) < decoded_mb + 192
    assert resident_mb(pid) < 192  # malloc_trim gave the page back


async def test_decoded_bytes_count_bit_depth_and_channels():
    """``max_page_bytes`` is checked before decoding, with 2 bytes a 16-bit sample."""
    pre = Preprocessor(CFG.model_copy(update={"max_page_bytes": 200 * MIB}))
    try:
        (failure,) = await decode(pre, samples.blank_png(12000, 12000, bit_depth=16))
    finally:
        pre.close()
    assert isinstance(failure.problem, PayloadTooLarge)
    assert "decodes to 275 MiB (12000 x 12000, mode I;16)" in failure.problem.detail
    assert "max_page_bytes" in failure.problem.detail


async def test_a_webp_header_bomb_is_refused_within_the_memory_limit(preprocessor):
    pid = preprocessor.worker_pids()[0]  # the interactive pool's process, which decodes at priority 0
    try:
        outcome = (await decode(preprocessor, samples.webp_header_bomb(16383, 9000)))[0].problem
    except ProblemError as problem:
        outcome = problem
    assert 400 <= outcome.status < 500
    assert peak_mb(pid) < LIMIT_MB


async def test_a_pdf_that_exhausts_its_decoding_process_is_422_once_and_the_next_is_served(preprocessor):
    """100 M unbalanced ``q`` operators took a decoding process to 17 GB, and then a second one
    when the document was tried again (issue 10): now the capped process dies once, the document
    gets 422, and a fresh process serves the next one."""
    first = preprocessor.worker_pids()[0]
    started = time.monotonic()
    with pytest.raises(PoisonDocument, match="killed its decoding process"):
        await decode(preprocessor, samples.pdf_q_bomb(100_000_000))
    assert time.monotonic() - started < 10
    (page,) = await decode(preprocessor, PHOTOTEST)
    assert (page.width, page.height) == (640, 480)
    assert preprocessor.worker_pids()[0] != first


@pytest.mark.parametrize("preprocessor", [{"page_timeout_s": 0.3}], indirect=True)
async def test_a_page_over_its_time_limit_is_422_and_the_next_is_served(preprocessor):
    with pytest.raises(PoisonDocument, match="longer than 0.3 s"):
        await decode(preprocessor, samples.blank_png(12000, 12000, bit_depth=16))
    (page,) = await decode(preprocessor, PHOTOTEST)
    assert (page.width, page.height) == (640, 480)


async def test_a_poison_document_loses_no_neighbour_s_work():
    """Each decoding process runs one task: the one a bomb kills takes no other document with it."""
    pre = Preprocessor(CFG.model_copy(update={"workers": 2}))
    try:
        await pre.warm_up()
        bomb, neighbour = await asyncio.gather(
            decode(pre, samples.pdf_q_bomb(100_000_000)), decode(pre, PHOTOTEST), return_exceptions=True
        )
    finally:
        pre.close()
    assert isinstance(bomb, PoisonDocument)
    assert (neighbour[0].width, neighbour[0].height) == (640, 480)


@pytest.mark.parametrize("preprocessor", [{"worker_recycle_mb": 1}], indirect=True)
async def test_a_process_holding_more_than_the_high_water_mark_is_replaced(preprocessor):
    """With a 1 MiB mark every task's process is replaced, and the fresh one starts at once."""
    before = await started_pids(preprocessor, set())
    (page,) = await decode(preprocessor, PHOTOTEST)
    assert (page.width, page.height) == (640, 480)
    assert await started_pids(preprocessor, before) - before


async def started_pids(preprocessor: Preprocessor, known: set[int]) -> set[int]:
    """The pids of both decoding processes (interactive and background) once both have started and
    one of them is not in ``known``."""
    for _ in range(600):
        pids = set(preprocessor.worker_pids())
        if len(pids) == 2 and pids - known:
            return pids
        await asyncio.sleep(0.05)
    raise AssertionError("no new decoding process started in 30 s")


def test_counting_pages_does_not_parse_their_content():
    """12 pages sharing one stream of 50 M balanced ``q Q`` took minutes to inspect, as loading a
    page with pdfium parses its content (a fresh user's finding); their sizes are read without."""
    heavy = samples.pdf_q_bomb(50_000_000, pages=12, operator=b"q Q ")
    started = time.monotonic()
    info = inspect_document(heavy, CFG)
    assert (info.kind, info.page_count, time.monotonic() - started < 1) == ("pdf", 12, True)


@pytest.mark.slow
def test_the_gateway_answers_bombs_with_4xx_and_keeps_serving(tmp_path):
    """Over HTTP: each bomb is answered its 4xx within 10 s and the next request is served; in a
    job, a page that exhausts its process fails once with 422, as the page's own fault, not as an
    engine's."""
    with job_gateway(tmp_path, "preprocess.worker_memory_mb=512").wait_ready() as gw:
        http = httpx.Client(base_url=gw.url, timeout=60)
        bombs = {
            "q.pdf": (samples.pdf_q_bomb(100_000_000), 422),
            "header.webp": (samples.webp_header_bomb(16383, 9000), 415),
            "wide.png": (samples.blank_png(1, 100_000), 413),
            "rgb.png": (samples.blank_png(12000, 12000, color_type=2), 422),
        }
        for name, (data, status) in bombs.items():
            started = time.monotonic()
            response = http.post("/v1/ocr", files={"file": (name, data)})
            assert (response.status_code, time.monotonic() - started < 10) == (status, True), response.text
            assert response.headers["content-type"] == "application/problem+json"
            assert http.post("/v1/ocr", files={"file": ("ok.tif", PHOTOTEST)}).status_code == 200
        for name in ("q.pdf", "rgb.png"):
            job = http.post("/v1/jobs", files={"file": (name, bombs[name][0])})
            assert job.status_code == 202, job.text
            status = wait_job(http, job.json()["id"])
            (error,) = status["errors"]
            assert (status["status"], error["error"]["status"], error["error"]["attempts"]) == ("failed", 422, 1)
