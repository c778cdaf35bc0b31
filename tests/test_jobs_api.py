"""Durable jobs over real HTTP: one gateway (uvicorn, the embedded engine, a SQLite store) for the
module, a real webhook receiver on loopback, and the ``ocrserve ocr --async`` client."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from PIL import Image

from ocrserve.config import JobsConfig
from ocrserve.errors import BadRequest
from ocrserve.jobs.webhooks import check_webhook_url, host_allowed
from tests import samples
from tests.conftest import DATA
from tests.jobs_util import (
    engine_pages,
    job_gateway,
    metric,
    numbered_page,
    numbered_tiff,
    page_number,
    read_events,
    wait_job,
)
from tests.test_api import assert_problem

SECRET = "test-webhook-secret"
CONCURRENCY = 2


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = job_gateway(
        tmp_path_factory.mktemp("jobs"),
        "store.cache_sync=true",
        f"jobs.concurrency={CONCURRENCY}",
        f"jobs.webhook_secret={SECRET}",
        "jobs.webhook_allow_hosts=[127.0.0.1]",
        "jobs.webhook_allow_private=true",
        "jobs.webhook_backoff_s=0.2",
        "preprocess.max_page_pixels=1000000",
    ).wait_ready()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def http(gw):
    with httpx.Client(base_url=gw.url, timeout=60) as client:
        yield client


def submit(http: httpx.Client, *docs: tuple[str, bytes], headers=None, **form) -> httpx.Response:
    return http.post("/v1/jobs", files=[("file", doc) for doc in docs], data=form, headers=headers)


def accepted(response: httpx.Response) -> str:
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    assert response.headers["location"] == f"/v1/jobs/{job_id}"
    return job_id


def test_job_lifecycle_result_and_formats(http):
    response = submit(http, ("numbers.tif", numbered_tiff(3)), ("photo.tif", (DATA / "phototest.tif").read_bytes()))
    job_id = accepted(response)
    assert response.json()["status"] in ("queued", "running") and response.json()["pages_total"] == 4
    status = wait_job(http, job_id)
    assert (status["status"], status["pages_done"], status["pages_failed"], status["errors"]) == ("succeeded", 4, 0, [])
    assert [d["name"] for d in status["documents"]] == ["numbers.tif", "photo.tif"]
    result = http.get(f"/v1/jobs/{job_id}/result").json()
    assert {"id", "model", "lane", "text", "pages", "usage", "documents"} <= set(result)
    assert (result["id"], result["lane"], result["model"]) == (job_id, "bulk", "rapidocr/PP-OCRv6-small")
    assert [(p["document"], p["index"]) for p in result["pages"]] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert [page_number(p["text"]) for p in result["pages"][:3]] == [1, 2, 3]
    assert result["pages"][3]["text"].startswith("This is a lot of 12 point text")
    assert (result["pages"][3]["width"], result["pages"][3]["height"]) == (640, 480)
    assert {"queue_s", "preprocess_s", "engine_s"} <= set(result["pages"][0]["timings"])
    assert result["documents"][1] == {"name": "photo.tif", "sha256": status["documents"][1]["sha256"], "pages": [3]}
    assert result["usage"]["pages"] == 4 and result["text"].count("\f") == 3
    text = http.get(f"/v1/jobs/{job_id}/result", params={"format": "text"})
    assert text.headers["content-type"].startswith("text/plain")
    assert [page_number(t) for t in text.text.split("\f")[:3]] == [1, 2, 3]
    assert http.get(f"/v1/jobs/{job_id}/result?format=markdown").text.startswith("# numbers.tif\n\n## Page 1\n")
    assert_problem(http.get(f"/v1/jobs/{job_id}/result?format=pdf"), 400, "format")
    assert_problem(http.get("/v1/jobs/nope"), 404, "no job 'nope'")
    assert_problem(http.get("/v1/jobs/nope/events"), 404, "no job")


def test_sse_in_order_complete_and_resumable(http):
    job_id = accepted(submit(http, ("five.tif", numbered_tiff(5, first=11))))
    events = read_events(http, job_id)  # opened while the job runs
    pages, done = events[:-1], events[-1]
    assert [e[0] for e in pages] == ["page"] * 5 and done[0] == "done"
    assert [e[1] for e in pages] == ["1", "2", "3", "4", "5"]
    assert [e[2]["pages_done"] for e in pages] == [1, 2, 3, 4, 5]
    assert sorted(e[2]["page"] for e in pages) == list(range(5))
    assert all(e[2]["state"] == "done" and e[2]["pages_total"] == 5 for e in pages)
    assert done[2]["status"] == "succeeded" and done[2]["pages_done"] == 5
    resumed = read_events(http, job_id, last_event_id=3)
    assert [(e[0], e[1]) for e in resumed] == [("page", "4"), ("page", "5"), ("done", "5")]  # done: no id of its own
    assert resumed[0][2] == pages[3][2]
    for odd in (-5, 99999999999999999999999):  # not event ids: replay from the start (issue 10)
        assert [e[1] for e in read_events(http, job_id, last_event_id=odd)][:5] == ["1", "2", "3", "4", "5"]


def test_idempotency_key(http):
    key = {"Idempotency-Key": uuid.uuid4().hex}
    doc = ("a.png", samples.encode(numbered_page(31), "PNG"))
    first = accepted(submit(http, doc, headers=key))
    replay = submit(http, doc, headers=key)
    assert accepted(replay) == first and replay.headers["idempotent-replayed"] == "true"
    other = ("a.png", samples.encode(numbered_page(32), "PNG"))
    assert_problem(submit(http, other, headers=key), 409, f"used for job {first} with a different request")
    assert_problem(submit(http, doc, headers=key, priority="3"), 409, "different request")
    assert_problem(submit(http, doc, headers={"Idempotency-Key": "x" * 300}), 400, "Idempotency-Key")
    assert wait_job(http, first)["status"] == "succeeded"


def test_dedup_hit_does_no_engine_work(http):
    png = samples.encode(numbered_page(41), "PNG")
    first = http.post("/v1/ocr", files={"file": ("d.png", png)})
    assert first.status_code == 200 and first.headers["x-cache"] == "miss"
    before = engine_pages(http)
    again = http.post("/v1/ocr", files={"file": ("other-name.png", png)}, data={"pages": "1"})  # canonical: same pages
    assert again.status_code == 200 and again.headers["x-cache"] == "hit"
    assert again.json()["text"] == first.json()["text"] and again.json()["id"] != first.json()["id"]
    response = submit(http, ("d.png", png))
    job_id = accepted(response)
    assert response.headers["x-cache"] == "hit" and response.json()["status"] == "succeeded"
    result = http.get(f"/v1/jobs/{job_id}/result")
    assert result.headers["x-cache"] == "hit" and result.json()["text"] == first.json()["text"]
    assert engine_pages(http) == before
    assert metric(http, "ocrserve_dedup_lookups_total", result="hit") >= 2


def test_cancel_keeps_queued_pages_from_the_engine(http):
    before = engine_pages(http)
    job_id = accepted(submit(http, ("twenty.tif", numbered_tiff(20, first=100))))
    wait_job(http, job_id, until=lambda s: s["pages_done"] >= 1)
    assert_problem(http.get(f"/v1/jobs/{job_id}/result"), 409, "running")
    cancelled = http.delete(f"/v1/jobs/{job_id}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    time.sleep(1.5)  # a page already in the engine may finish; nothing else may start
    settled = engine_pages(http)
    time.sleep(2.0)
    assert engine_pages(http) == settled
    status = http.get(f"/v1/jobs/{job_id}").json()
    assert status["status"] == "cancelled" and status["pages_done"] < 20
    assert settled - before <= status["pages_done"] + CONCURRENCY  # finished ones, plus those already claimed
    result = http.get(f"/v1/jobs/{job_id}/result").json()
    unfinished = [p for p in result["pages"] if p.get("error")]
    assert len(unfinished) == 20 - status["pages_done"] and unfinished[0]["error"]["status"] == 409
    events = read_events(http, job_id)
    assert events[-1][0] == "done" and events[-1][2]["status"] == "cancelled"
    assert len(events) - 1 == status["pages_done"]
    assert http.delete(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"  # again: no-op
    assert_problem(http.delete("/v1/jobs/nope"), 404, "no job")


class Receiver:
    """A webhook receiver on loopback: answers each call with the next status of ``statuses``."""

    def __init__(self, *statuses: int):
        self.calls: list[tuple[dict, bytes]] = []
        self.statuses = list(statuses)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, calls: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.calls) < calls:
            assert time.monotonic() < deadline, f"{len(self.calls)} webhook call(s), expected {calls}"
            time.sleep(0.05)


def test_webhook_signed_and_retried(http):
    receiver = Receiver(500)  # the first call fails: the gateway must retry
    try:
        job_id = accepted(submit(http, ("w.png", samples.encode(numbered_page(51), "PNG")), webhook_url=receiver.url))
        receiver.wait(2)
    finally:
        receiver.server.shutdown()
    for headers, body in receiver.calls:
        timestamp = headers["x-ocrserve-timestamp"]
        expected = "sha256=" + hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["x-ocrserve-signature"], expected)
        assert abs(time.time() - int(timestamp)) < 60 and headers["x-ocrserve-job"] == job_id
        assert headers["content-type"] == "application/json"
        payload = json.loads(body)
        assert (payload["id"], payload["status"], payload["pages_done"]) == (job_id, "succeeded", 1)
    assert metric(http, "ocrserve_jobs_webhooks_total", outcome="delivered") >= 1


@pytest.mark.parametrize(
    "url, detail",
    [
        ("http://example.com/hook", "not on jobs.webhook_allow_hosts"),
        ("http://localhost:9/hook", "'localhost' is not on jobs.webhook_allow_hosts"),
        ("ftp://127.0.0.1/hook", "http:// or https://"),
    ],
)
def test_webhook_off_the_allow_list_is_refused_at_submission(http, url, detail):
    submitted = metric(http, "ocrserve_jobs_submitted_total", kind="new")
    body = assert_problem(
        submit(http, ("w.png", samples.encode(numbered_page(52), "PNG")), webhook_url=url), 400, detail
    )
    assert body["type"].endswith(("webhook-refused", "bad-request"))
    assert metric(http, "ocrserve_jobs_submitted_total", kind="new") == submitted


def test_webhook_guard_resolves_and_refuses_private_addresses():
    allowed = JobsConfig(webhook_allow_hosts=["127.0.0.1", "localhost", "*.example.org"])
    assert host_allowed("hooks.example.org", allowed.webhook_allow_hosts)
    assert not host_allowed("example.org", allowed.webhook_allow_hosts)
    assert not host_allowed("evil-example.org", allowed.webhook_allow_hosts)
    for url in ("http://127.0.0.1:9/x", "http://localhost/x"):
        with pytest.raises(BadRequest, match="loopback, private or link-local"):
            asyncio.run(check_webhook_url(url, allowed))
    private = allowed.model_copy(update={"webhook_allow_private": True})
    assert asyncio.run(check_webhook_url("http://127.0.0.1:9/x", private)) == "http://127.0.0.1:9/x"
    metadata = JobsConfig(webhook_allow_hosts=["169.254.169.254"])
    with pytest.raises(BadRequest, match="169.254.169.254"):
        asyncio.run(check_webhook_url("http://169.254.169.254/latest/meta-data", metadata))
    for malformed in ("http://[::1", "http://hooks.example.org:99999/x"):  # were 500s (issue 10)
        with pytest.raises(BadRequest, match="not a URL"):
            asyncio.run(check_webhook_url(malformed, allowed))


def test_refusals_at_submission(http):
    assert_problem(submit(http, ("x.bin", b"not a document")), 415, "not a supported document")
    assert_problem(submit(http, ("big.pdf", samples.blank_pdf(201))), 413, "max_pages=200")
    assert_problem(submit(http, ("ok.png", samples.encode(numbered_page(1), "PNG")), priority="10"), 400, "priority")
    assert_problem(submit(http, ("ok.png", samples.encode(numbered_page(1), "PNG")), pages="3"), 400, "pages")
    assert_problem(http.post("/v1/jobs", files={"priority": (None, "1")}), 400, "file")
    assert_problem(submit(http, ("huge.png", samples.png_header_only(40000, 40000))), 413, "max_page_pixels")
    two_large = samples.encode(
        samples.phototest().resize((1280, 960)),
        "TIFF",
        save_all=True,
        append_images=[samples.phototest().resize((1280, 960))],
    )  # 1.2 Mpx > 1 Mpx
    assert_problem(submit(http, ("large.tif", two_large)), 413, "page 1 is 1280 x 960")
    for field, value in (("timeout", "abc"), ("format", "xml")):  # as POST /v1/ocr checks them without the header
        assert_problem(
            http.post(
                "/v1/ocr",
                files={"file": ("ok.png", samples.encode(numbered_page(1), "PNG"))},
                data={field: value},
                headers={"prefer": "respond-async"},
            ),
            400,
            field,
        )
    png = samples.encode(numbered_page(1), "PNG")
    assert_problem(http.post("/v1/jobs", files=[("file", ("p.png", png))] * 101), 400, "jobs.max_files=100")


def test_failed_page_makes_the_job_partial(http):
    small, large = numbered_page(61).convert("RGB"), samples.phototest().resize((1280, 960))  # 1.2 Mpx > 1 Mpx
    tiff = samples.encode(small, "TIFF", save_all=True, append_images=[large])
    job_id = accepted(submit(http, ("mixed.tif", tiff)))
    status = wait_job(http, job_id)
    assert (status["status"], status["pages_done"], status["pages_failed"]) == ("partial", 2, 1)
    (error,) = status["errors"]
    assert (error["page"], error["index"], error["error"]["status"]) == (1, 1, 413)
    assert "max_page_pixels" in error["error"]["detail"] and error["error"]["attempts"] == 1
    result = http.get(f"/v1/jobs/{job_id}/result").json()
    assert page_number(result["pages"][0]["text"]) == 61 and result["pages"][1]["error"]["status"] == 413
    assert result["usage"]["pages"] == 1


def test_jobs_refuse_what_the_sync_path_refuses_and_a_broken_page_fails_once(http):
    """A 1 x 400 strip is refused before the 202, as the synchronous path refuses it; a truncated
    PNG in a job fails its page with 415 after one attempt, not as an engine fault (issue 10)."""
    strip = samples.encode(Image.new("L", (1, 400), 255), "PNG")
    assert_problem(submit(http, ("strip.png", strip)), 413, "aspect ratio 400:1")
    png = samples.encode(numbered_page(90), "PNG")
    status = wait_job(http, accepted(submit(http, ("cut.png", png[: len(png) // 2]))))
    assert (status["status"], status["pages_failed"]) == ("failed", 1)
    (error,) = status["errors"]
    assert (error["error"]["status"], error["error"]["attempts"]) == (415, 1)


def test_prefer_respond_async_makes_a_job(http):
    response = http.post(
        "/v1/ocr",
        content=samples.encode(numbered_page(71), "PNG"),
        headers={"content-type": "image/png", "prefer": "respond-async"},
    )
    job_id = accepted(response)
    assert response.headers["preference-applied"] == "respond-async"
    assert wait_job(http, job_id)["status"] == "succeeded"
    assert page_number(http.get(f"/v1/jobs/{job_id}/result?format=text").text) == 71


def test_a_jobs_timeout_is_its_deadline(http):
    """``timeout`` on a job (here through ``Prefer: respond-async``) is kept with it: pages not done
    that long after the 202 fail with 504, at once and without retries (the deadline stays passed)."""
    response = http.post(
        "/v1/ocr?timeout=0.001",
        content=numbered_tiff(3, first=80),
        headers={"content-type": "image/tiff", "prefer": "respond-async"},
    )
    status = wait_job(http, accepted(response))
    assert (status["status"], status["pages_failed"]) == ("failed", 3)
    assert {(e["error"]["status"], e["error"]["attempts"]) for e in status["errors"]} == {(504, 1)}


def test_higher_priority_job_finishes_first(http):
    low = accepted(submit(http, ("low.tif", numbered_tiff(5, first=200))))
    high = accepted(submit(http, ("high.tif", numbered_tiff(2, first=300)), priority="9"))
    low_status, high_status = wait_job(http, low), wait_job(http, high)
    assert high_status["finished_at"] < low_status["finished_at"]


def test_cli_async_writes_next_to_inputs_and_resumes(http, gw, tmp_path):
    (tmp_path / "a.tif").write_bytes(numbered_tiff(2, first=80))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.png").write_bytes(samples.encode(numbered_page(90), "PNG"))
    command = [sys.executable, "-m", "ocrserve", "ocr", str(tmp_path), "--async", "--url", gw.url]

    def run() -> subprocess.CompletedProcess:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done

    first = run()
    assert "wrote 2 result(s), skipped 0" in first.stderr
    assert [page_number(t) for t in (tmp_path / "a.tif.txt").read_text().split("\f")] == [80, 81]
    assert page_number((tmp_path / "sub" / "b.png.txt").read_text()) == 90
    submitted, engine = metric(http, "ocrserve_jobs_submitted_total", kind="new"), engine_pages(http)
    assert "wrote 0 result(s), skipped 2" in run().stderr  # nothing to do
    (tmp_path / "a.tif.txt").unlink()
    replays = metric(http, "ocrserve_jobs_submitted_total", kind="replay")
    assert "wrote 1 result(s), skipped 1" in run().stderr  # resumed: the same job, not a new one
    assert [page_number(t) for t in (tmp_path / "a.tif.txt").read_text().split("\f")] == [80, 81]
    assert metric(http, "ocrserve_jobs_submitted_total", kind="replay") == replays + 1
    assert metric(http, "ocrserve_jobs_submitted_total", kind="new") == submitted
    assert engine_pages(http) == engine
