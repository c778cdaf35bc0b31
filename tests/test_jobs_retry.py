"""Transient failures are retried with backoff up to jobs.max_attempts, then the page fails.

The failure is real, not simulated: a bulk lane whose deadline (``router.bulk.timeout_s``) is a
microsecond drops every page before it reaches the engine (504, a transient failure)."""

from __future__ import annotations

import httpx

from tests import samples
from tests.jobs_util import engine_pages, job_gateway, metric, numbered_page, wait_job


def test_transient_failures_are_retried_then_fail(tmp_path):
    gateway = job_gateway(
        tmp_path, "router.bulk.timeout_s=0.000001", "jobs.max_attempts=3", "jobs.retry_backoff_s=0.2"
    ).wait_ready()
    try:
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            png = samples.encode(numbered_page(7), "PNG")
            job_id = http.post("/v1/jobs", files={"file": ("p.png", png)}).json()["id"]
            status = wait_job(http, job_id)
            assert (status["status"], status["pages_failed"]) == ("failed", 1)
            (error,) = status["errors"]
            assert (error["error"]["status"], error["error"]["attempts"]) == (504, 3)
            assert metric(http, "ocrserve_jobs_pages_total", outcome="retried") == 2
            assert metric(http, "ocrserve_jobs_claims_total", kind="again") == 2
            assert engine_pages(http) == 0  # dropped in the queue every time
            sync = http.post("/v1/ocr", files={"file": ("p.png", png)})  # the fast lane is unaffected
            assert sync.status_code == 200 and "7" in sync.json()["text"]
    finally:
        gateway.stop()
