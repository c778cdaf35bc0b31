"""Documents and helpers shared by the job tests: small numbered pages (quick to OCR, each page
telling which it is), waiting for a job, reading a metric, a gateway on a given store."""

from __future__ import annotations

import re
import time

import httpx
from httpx_sse import connect_sse
from PIL import Image, ImageDraw, ImageFont

from tests import samples
from tests.conftest import Gateway


def numbered_page(number: int) -> Image.Image:
    """A 240 x 200 white page reading ``Page`` over ``<number>`` in 48-px type.

    Nearly square on purpose: the detector scales a page's shorter side up to 736 px, so a wide
    strip would cost several times more engine time; two lines read reliably (one line tends to be
    split in two)."""
    page = Image.new("L", (240, 200), 255)
    ImageDraw.Draw(page).multiline_text(
        (30, 30), f"Page\n{number}", font=ImageFont.load_default(size=48), fill=0, spacing=24
    )
    return page


def numbered_tiff(pages: int, first: int = 1) -> bytes:
    """A multi-page TIFF whose page ``i`` (0-based) reads ``Page <first + i>``."""
    images = [numbered_page(first + i) for i in range(pages)]
    return samples.encode(images[0], "TIFF", save_all=True, append_images=images[1:])


def page_number(text: str) -> int | None:
    """The number a numbered page was read as, or None."""
    found = re.search(r"(\d+)", text)
    return int(found.group(1)) if found else None


def metric(http: httpx.Client, name: str, **labels) -> float:
    """One sample's value from /metrics (0 when absent)."""
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{name}{{{selector}}} (\S+)$" if labels else rf"^{name} (\S+)$"
    found = re.search(pattern, http.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def engine_pages(http: httpx.Client) -> float:
    """Pages this gateway has handed to its engine, all lanes."""
    return sum(metric(http, "ocrserve_engine_pages_total", lane=lane) for lane in ("fast", "bulk"))


def wait_job(http: httpx.Client, job_id: str, timeout: float = 120.0, until=None) -> dict:
    """Poll ``GET /v1/jobs/{id}`` until ``until(status)`` (default: the job ended); returns the status."""
    until = until or (lambda s: s["status"] not in ("queued", "running"))
    deadline = time.monotonic() + timeout
    while True:
        status = http.get(f"/v1/jobs/{job_id}").json()
        if until(status):
            return status
        assert time.monotonic() < deadline, f"job {job_id} stuck: {status}"
        time.sleep(0.1)


def read_events(http: httpx.Client, job_id: str, last_event_id: int | None = None) -> list[tuple[str, str, dict]]:
    """The job's whole event stream, to its ``done``: ``(event, id, data)`` tuples (``id`` is the last
    event id seen, as the SSE spec keeps it: ``done`` carries none of its own)."""
    headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
    events = []
    with connect_sse(http, "GET", f"/v1/jobs/{job_id}/events", headers=headers) as source:
        response = source.response
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        for sse in source.iter_sse():
            if sse.data:  # not a keep-alive
                events.append((sse.event, sse.id, sse.json()))
                if sse.event == "done":
                    break
    return events


def job_gateway(data_dir, *overrides: str, log_file=None) -> Gateway:
    """A gateway (not yet ready) keeping its jobs in ``data_dir``, with quick polls and leases; its
    log appended to ``log_file`` if given."""
    return Gateway(
        f"store.data_dir={data_dir}",
        "jobs.poll_interval_s=0.1",
        "jobs.lease_s=2",
        "jobs.events_poll_s=0.1",
        *overrides,
        log_file=log_file,
    )
