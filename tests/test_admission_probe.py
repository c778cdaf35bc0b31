"""A request refused only for admission's margin for the unseen, on an idle engine, teaches the
cost model: its first page runs as a probe at the lowest priority, one at a time, the refusal does
not wait for it, and the client's retry runs only the pages it did not (a real gateway on
loopback, the real ONNX engine)."""

from __future__ import annotations

import math
import re

import httpx

from tests.conftest import Gateway, wait_for
from tests.jobs_util import engine_pages, metric, numbered_tiff, page_number
from tests.test_api import assert_problem


def probes(client: httpx.Client) -> float:
    return sum(metric(client, "ocrserve_admission_probes_total", lane=lane) for lane in ("fast", "bulk"))


def test_a_document_refused_only_for_the_margin_on_an_idle_engine_has_its_first_page_probed():
    document = numbered_tiff(2)
    with Gateway() as gateway, httpx.Client(base_url=gateway.url, timeout=60) as client:

        def post(timeout: float) -> httpx.Response:
            return client.post("/v1/ocr", files={"file": ("d.tif", document)}, data={"timeout": str(timeout)})

        # shorter than its pages alone take: refused, and no margin is to blame, so no probe
        hopeless = assert_problem(post(0.5), 503, r"even on an idle engine it would take about [\d.]+ s")
        alone = float(re.search(r"about ([\d.]+) s", hopeless["detail"]).group(1))  # with the margin, 1.5
        assert probes(client) == 0
        # long enough for its pages without the margin, not with it: refused at once, its first page probed
        refused = post(round(0.9 * alone, 1))
        body = assert_problem(refused, 503, r"its page 1 is being read meanwhile, at the lowest priority")
        assert body["type"].endswith("/deadline-unmeetable") and body["detail"].endswith("POST /v1/jobs)")
        # until its one page is read, by its bound alone with the margin: about half the document's
        assert 1 <= int(refused.headers["retry-after"]) <= math.ceil(alone / 2 + 0.1)
        assert probes(client) == 1
        # the probe's page is in the engine (or decoding): not idle, so the same refusal probes nothing more
        again = assert_problem(post(round(0.9 * alone, 1)), 503, r"cannot finish 2 page\(s\)")
        assert "being read meanwhile" not in again["detail"] and probes(client) == 1
        wait_for(lambda: engine_pages(client) == 1 and metric(client, "ocrserve_engine_slots_in_use") == 0)
        assert metric(client, "ocrserve_engine_pages_total", lane="bulk") == 1  # the lowest priority's lane
        assert metric(client, "ocrserve_pages_total", outcome="ok") == 0  # answered to nobody yet
        # the retry: its second page alone priced and run, beside what the probe read of its first
        answered = post(round(0.9 * alone, 1))
        assert answered.status_code == 200, answered.text
        assert [page_number(page["text"]) for page in answered.json()["pages"]] == [1, 2]
        assert engine_pages(client) == 2 and probes(client) == 1
