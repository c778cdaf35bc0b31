"""Accepted work survives its gateway: kill -9 of a gateway mid-job, then a restart on the same
SQLite store (or a second gateway on the same Redis) finishes it, each page exactly once."""

from __future__ import annotations

import os
import re
import signal

import httpx
import pytest

from tests.conftest import wait_for
from tests.jobs_util import job_gateway, metric, numbered_tiff, page_number, read_events, wait_job
from tests.redis_server import redis_url  # noqa: F401  (fixture)

PAGES = 20


def kill_group(gateway) -> None:
    """SIGKILL the gateway's whole process group (uvicorn and its decoding processes): no cleanup runs."""
    os.killpg(gateway.proc.pid, signal.SIGKILL)
    gateway.proc.wait()


def assert_each_page_once(client: httpx.Client, job_id: str) -> None:
    status = client.get(f"/v1/jobs/{job_id}").json()
    assert (status["status"], status["pages_done"], status["pages_failed"]) == ("succeeded", PAGES, 0), status
    result = client.get(f"/v1/jobs/{job_id}/result").json()
    assert [p["index"] for p in result["pages"]] == list(range(PAGES))
    assert [page_number(p["text"]) for p in result["pages"]] == list(range(1, PAGES + 1))
    events = read_events(client, job_id)
    assert sorted(e[2]["page"] for e in events[:-1]) == list(range(PAGES))  # every page, none twice
    assert [e[2]["pages_done"] for e in events[:-1]] == list(range(1, PAGES + 1))
    assert events[-1][0] == "done"


@pytest.mark.slow
def test_sqlite_job_survives_kill_9_and_restart(tmp_path):
    first = job_gateway(tmp_path).wait_ready()
    try:
        with httpx.Client(base_url=first.url, timeout=60) as client:
            files = {"file": ("twenty.tif", numbered_tiff(PAGES))}
            response = client.post("/v1/jobs", files=files, headers={"X-Request-ID": "durable-1"})
            job_id = response.json()["id"]
            wait_job(client, job_id, until=lambda s: s["pages_done"] >= 3)
            held = metric(client, "ocrserve_jobs_pages_in_flight")
    finally:
        kill_group(first)
    assert held >= 1  # pages were claimed and unfinished when the gateway died
    log = tmp_path / "second.log"
    second = job_gateway(tmp_path, log_file=log).wait_ready()
    try:
        with httpx.Client(base_url=second.url, timeout=60) as client:
            assert client.get(f"/v1/jobs/{job_id}").json()["pages_done"] < PAGES
            wait_job(client, job_id)
            assert_each_page_once(client, job_id)
            assert metric(client, "ocrserve_jobs_claims_total", kind="again") >= 1  # lapsed leases re-claimed
        # one warning names the job, its pages claimed again and the request that created the job
        warning = re.compile(rf"WARNING \S+ \[durable-1\] job {job_id}: (\d+) page\(s\) claimed again after")
        found = wait_for(lambda: warning.findall(log.read_text()), timeout=30)
        assert len(found) == 1 and int(found[0]) >= 1, log.read_text()
    finally:
        second.stop()


@pytest.mark.redis
def test_two_gateways_on_one_redis_share_a_job_and_survive_a_kill(tmp_path, redis_url):  # noqa: F811
    store = (f"store.url={redis_url}", "store.key_prefix=durability")
    a, b = job_gateway(tmp_path, *store), job_gateway(tmp_path, *store)
    try:
        a.wait_ready(), b.wait_ready()
        with httpx.Client(base_url=a.url, timeout=60) as on_a, httpx.Client(base_url=b.url, timeout=60) as on_b:
            job_id = on_a.post("/v1/jobs", files={"file": ("twenty.tif", numbered_tiff(PAGES))}).json()["id"]
            assert on_b.get(f"/v1/jobs/{job_id}").json()["pages_total"] == PAGES  # visible on B
            wait_job(on_b, job_id, until=lambda s: s["pages_done"] >= 4)
            assert metric(on_a, "ocrserve_jobs_pages_total", outcome="done") >= 1  # A did part of it
            kill_group(a)
            assert on_b.get(f"/v1/jobs/{job_id}").json()["pages_done"] < PAGES
            wait_job(on_b, job_id)
            assert_each_page_once(on_b, job_id)
            assert metric(on_b, "ocrserve_jobs_claims_total", kind="again") >= 1  # B took over A's claims
    finally:
        a.stop(), b.stop()
