"""Lanes seen from HTTP: lane choice, 503 + Retry-After, 504 before the engine, disconnects."""

from __future__ import annotations

import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image

from ocrserve.preview_turn import PRIOR_PAGE_S
from tests import samples
from tests.conftest import DATA, Gateway, post_then_hang_up
from tests.test_api import assert_problem


def metric(http: httpx.Client, name: str, **labels) -> float:
    """One sample's value from /metrics (0 when absent)."""
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{name}{{{selector}}} (\S+)$" if labels else rf"^{name} (\S+)$"
    found = re.search(pattern, http.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def six_page_tiff() -> bytes:
    page = samples.phototest()
    return samples.encode(
        page, "TIFF", save_all=True, append_images=[page.transpose(Image.Transpose.FLIP_LEFT_RIGHT)] * 5
    )


@pytest.fixture(scope="module")
def gw():
    # one engine slot, no burst beyond it; a fast lane that holds 2 pages, a bulk lane of 8; no
    # latency target (these tests fill the lanes on purpose; the target has its own tests)
    gateway = Gateway(
        "router.slot_overcommit=0.5",
        "router.fast.burst_slots=0",
        "router.fast.queue_pages=2",
        "router.bulk.queue_pages=8",
        "router.fast.latency_target_s=3600",
    ).wait_ready()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def http(gw):
    with httpx.Client(base_url=gw.url, timeout=120) as client:
        yield client


_posting: list[threading.Thread] = []


@pytest.fixture(autouse=True)
def posts_done():
    """Every background POST of a test is answered before the next test starts, also when the test
    failed before joining it: a neighbour's pages left in a lane would fail the tests after it."""
    yield
    while _posting:
        _posting.pop().join()


def background_post(url: str, data: bytes, **form) -> threading.Thread:
    def post():
        httpx.post(url + "/v1/ocr", files={"file": ("d", data)}, data=form, timeout=120)

    thread = threading.Thread(target=post)
    thread.start()
    _posting.append(thread)
    return thread


def wait_metric(http, name, at_least, timeout=60, **labels):
    deadline = time.monotonic() + timeout
    while metric(http, name, **labels) < at_least:
        assert time.monotonic() < deadline, f"{name}{labels} stayed below {at_least}"
        time.sleep(0.05)


def test_small_request_fast_lane_large_bulk(http):
    tif = (DATA / "phototest.tif").read_bytes()
    assert http.post("/v1/ocr", files={"file": ("a", tif)}).json()["lane"] == "fast"
    assert http.post("/v1/ocr", files={"file": ("a", tif)}, data={"priority": "bulk"}).json()["lane"] == "bulk"


@pytest.mark.slow
def test_full_lane_503_with_computed_retry_after_then_recovers(gw, http):
    tif = (DATA / "phototest.tif").read_bytes()
    assert http.post("/v1/ocr", files={"file": ("a", tif)}).status_code == 200  # the lane has drained a page
    busy = background_post(gw.url, six_page_tiff())  # occupies the only slot for a while
    wait_metric(http, "ocrserve_engine_slots_in_use", 1)
    fillers = [background_post(gw.url, tif, priority="interactive") for _ in range(2)]
    wait_metric(http, "ocrserve_queued_pages", 2, lane="fast")
    refused = http.post("/v1/ocr", files={"file": ("a", tif)})
    body = assert_problem(refused, 503, r"fast lane holds 2 of 2 pages")
    shown = re.search(r"draining at ([\d.]+) pages/s, retry in (\d+) s", body["detail"])
    rate, wait = float(shown.group(1)), int(shown.group(2))
    # ceil(L / lambda) of the rate the detail rounds to 2 decimals (0.50 may be 0.4996: 5 s, not 4)
    assert math.ceil(2 / (rate + 0.005)) <= wait <= math.ceil(2 / (rate - 0.005)) and wait >= 1
    assert int(refused.headers["retry-after"]) == wait
    for thread in [busy, *fillers]:
        thread.join()
    assert http.post("/v1/ocr", files={"file": ("a", tif)}).status_code == 200


def test_a_deadline_that_cannot_be_met_is_refused_at_once_and_skips_engine(gw, http):
    """Behind a 6-page request on the only slot, a page with 0.3 s to live cannot finish: it gets
    503 with Retry-After at admission (issue 13), not a 504 after waiting for nothing."""
    busy = background_post(gw.url, six_page_tiff())
    wait_metric(http, "ocrserve_engine_slots_in_use", 1)
    engine_fast = metric(http, "ocrserve_engine_pages_total", lane="fast")
    refusals = metric(http, "ocrserve_rejections_total", lane="fast", reason="deadline_unmeetable")
    started = time.monotonic()
    refused = http.post(
        "/v1/ocr", files={"file": ("a", (DATA / "phototest.tif").read_bytes())}, data={"timeout": "0.3"}
    )
    seconds = time.monotonic() - started
    busy.join()
    body = assert_problem(refused, 503, r"cannot finish 1 page\(s\) within the request's 0\.\d s")
    assert body["type"].endswith("/deadline-unmeetable") and "Prefer: respond-async" in body["detail"]
    assert int(refused.headers["retry-after"]) >= 1 and seconds < 2  # refused, not waited on
    assert metric(http, "ocrserve_engine_pages_total", lane="fast") == engine_fast
    assert metric(http, "ocrserve_rejections_total", lane="fast", reason="deadline_unmeetable") == refusals + 1


def test_a_timeout_its_upload_used_up_is_refused_saying_send_a_longer_one(gw, http):
    """The timeout runs from the request's arrival: a page whose upload takes 1.6 s of its 2 s
    cannot be done in what is left on an idle engine. A retry with the same timeout cannot help,
    and the refusal says so, and how much the upload took."""
    data = (DATA / "phototest.tif").read_bytes()

    def slowly():
        for start in range(0, len(data), len(data) // 8 + 1):
            time.sleep(0.2)
            yield data[start : start + len(data) // 8 + 1]

    refused = http.post("/v1/ocr?timeout=2", content=slowly(), headers={"content-type": "image/tiff"})
    body = assert_problem(refused, 503, r"even on an idle engine it would take about \d+\.\d s; 1\.\d s of its timeout")
    assert "send a longer timeout" in body["detail"] and "retry in" not in body["detail"], body["detail"]


def test_client_disconnect_drops_queued_pages(gw, http):
    """A client that hangs up while its first page runs and others wait: the waiting pages are
    dropped from the queue (and the ones still being decoded never reach it), so fewer than its
    six pages reach the engine and nothing of it stays reserved in the lane."""
    engine_bulk = metric(http, "ocrserve_engine_pages_total", lane="bulk")
    cancelled = metric(http, "ocrserve_rejections_total", lane="bulk", reason="cancelled")

    def running_and_waiting() -> bool:
        running = metric(http, "ocrserve_engine_pages_total", lane="bulk") > engine_bulk
        return running and metric(http, "ocrserve_queued_cost", lane="bulk") > 0

    post_then_hang_up(gw.url + "/v1/ocr", {"file": ("d", six_page_tiff())}, running_and_waiting)
    wait_metric(http, "ocrserve_rejections_total", cancelled + 1, lane="bulk", reason="cancelled")
    deadline = time.monotonic() + 60
    while metric(http, "ocrserve_engine_slots_in_use") > 0 or metric(http, "ocrserve_queued_pages", lane="bulk") > 0:
        assert time.monotonic() < deadline, "the request's pages stayed in the engine or reserved in the lane"
        time.sleep(0.1)
    ran = metric(http, "ocrserve_engine_pages_total", lane="bulk") - engine_bulk
    dropped = metric(http, "ocrserve_rejections_total", lane="bulk", reason="cancelled") - cancelled
    assert dropped >= 1 and ran + dropped <= 6 and ran < 6


@pytest.fixture(scope="module")
def refusing():
    """A gateway that refuses a document not previewed at once, and a single page sent without its
    own timeout (the fast lane's latency target is a millisecond)."""
    gateway = Gateway(
        "router.admission_timeout_s=0.001", "router.fast.latency_target_s=0.001", "router.fair_by=header"
    ).wait_ready()
    yield gateway
    gateway.stop()


def test_a_document_not_previewed_within_the_admission_timeout_is_refused_with_retry_after(refusing):
    """A document's first pages are previewed and their line units counted one document at a time
    per lane; one whose turn and count would not end within ``router.admission_timeout_s`` of its
    arrival (here its own two pages, priced at the prior a page before any turn was timed) is
    refused at once, 503 ``admission-timeout`` with ``Retry-After`` for the rest, not left
    waiting, and the refusal is counted. A single page is not held to it."""
    with httpx.Client(base_url=refusing.url, timeout=60) as client:
        page = client.post(
            "/v1/ocr", files={"file": ("a", (DATA / "phototest.tif").read_bytes())}, data={"timeout": "60"}
        )
        assert page.status_code == 200, page.text
        document = (DATA / "testTIFF_multipage.tif").read_bytes()
        refused = client.post("/v1/ocr", files={"file": ("a", document)})
        body = assert_problem(refused, 503, r"in about 1 s, past router\.admission_timeout_s=0\.001 s")
        assert body["type"].endswith("/admission-timeout")
        assert refused.headers["retry-after"] == str(math.ceil(2 * PRIOR_PAGE_S - 0.001))
        assert metric(client, "ocrserve_rejections_total", lane="fast", reason="admission_timeout") == 1


def test_a_documents_line_units_are_counted_once_for_every_post_of_it(refusing):
    """The line units counted on a document's previews are kept: a retry of the same document,
    another client's post of it and a post after one was admitted are priced on them without
    previews; another document is counted. (Pages of their own: the gateway's earlier tests
    counted theirs.)"""
    page = samples.encode(samples.phototest(), "PNG")
    with httpx.Client(base_url=refusing.url, timeout=60) as client:

        def counts() -> tuple[float, float]:
            return tuple(metric(client, "ocrserve_line_counts_total", how=how) for how in ("counted", "kept"))

        def post(data: bytes, client_id: str, **form) -> httpx.Response:
            return client.post("/v1/ocr", files={"file": ("p", data)}, data=form, headers={"X-Client-Id": client_id})

        before = counts()
        for _ in range(2):  # refused by the latency target, after its line units were counted
            assert_problem(post(page, "a"), 503, r"above its latency target")
        assert_problem(post(page, "b"), 503, r"above its latency target")
        assert_problem(post(samples.encode(samples.phototest().rotate(180), "PNG"), "a"), 503, r"latency target")
        after = counts()
        assert (after[0] - before[0], after[1] - before[1]) == (2, 2)  # the first of each document counted
        assert post(page, "a", timeout="60").status_code == 200  # its own timeout: admitted
        assert post(page, "c", timeout="60").status_code == 200
        assert counts() == (after[0], after[1] + 2)


def test_a_burst_of_one_document_is_counted_once(gateway):
    """Clients posting one document at the same instant wait for the lane's preview turn one after
    another; the first counts the line units of its previews, and the others are priced on them
    when their turn comes (or at once, where they arrive after): one count for the burst."""
    page = samples.phototest().rotate(90, expand=True)
    document = samples.encode(
        page, "TIFF", save_all=True, append_images=[page.transpose(Image.Transpose.FLIP_TOP_BOTTOM)]
    )
    with httpx.Client(base_url=gateway.url, timeout=120) as client:

        def counts() -> tuple[float, float]:
            return tuple(metric(client, "ocrserve_line_counts_total", how=how) for how in ("counted", "kept"))

        def post(name: str) -> httpx.Response:
            form, headers = {"timeout": "120"}, {"X-Client-Id": name}
            return client.post("/v1/ocr", files={"file": ("d.tif", document)}, data=form, headers=headers)

        before = counts()
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(post, "abcd"))
        assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
        after = counts()
        assert (after[0] - before[0], after[1] - before[1]) == (1, 3)
