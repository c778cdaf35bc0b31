"""The vLLM engine end to end: a real gateway (``engine.kind: vllm``) in front of two real
``ocrserve engine serve`` replicas speaking vLLM's OpenAI chat-completions protocol; plus the
request recipe and reply reading of :mod:`ocrserve.engines.chat` on the registry's models."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from ocrserve.bench.harness import free_port
from ocrserve.config import load_config
from ocrserve.engine_server import REPLICA_HEADER
from ocrserve.engines.chat import CLEANERS, completion_request, image_data_uri, read_reply
from ocrserve.engines.vllm import Replica as VllmReplica
from ocrserve.engines.vllm import VllmEngine, read_vllm_metrics, server_root
from ocrserve.evaluation import bag_f1
from ocrserve.models import REGISTRY, get_model
from ocrserve.pages import Page
from tests import samples
from tests.conftest import DATA, Gateway, Replica, ground_truth, post_then_hang_up, wait_for
from tests.test_api import assert_problem

MODEL = "tencent/HunyuanOCR"
#: Decoded pixels a replica accepts per image: below a prod-profile page at its 4.19 Mpx budget,
#: so an image that large is a 400 from the replica (as vLLM refuses an image beyond its limits).
REPLICA_MAX_PAGE_PIXELS = 2_500_000
#: Test documents (5 pages) and the bag-of-words F1 each must reach through this path: gateway at
#: the prod pixel budget, PNG over HTTP, the replica's own normalization, ONNX OCR (all read 1.0
#: here). multi-line_en_black.png is left out: the embedded engine misreads two of its four lines
#: at any size (0.79 read directly), which would test the engine, not this path.
DOCUMENTS = {
    "phototest.tif": 0.95,
    "black_font_color_transparent.png": 0.95,
    "img_exif_orientation.jpg": 0.95,
    "testTIFF_multipage.tif": 0.95,
}


@pytest.fixture(scope="module")
def replicas():
    pair = [Replica(MODEL, REPLICA_MAX_PAGE_PIXELS), Replica(MODEL, REPLICA_MAX_PAGE_PIXELS)]
    try:
        yield [r.wait_healthy() for r in pair]
    finally:
        for r in pair:
            r.stop()


@pytest.fixture(scope="module")
def gateway(replicas):
    """The prod profile's gateway on the two replicas; the replicas' health is polled once at start
    and then not for an hour, so a replica that dies is found out by the request that hits it."""
    urls = ",".join(r.url for r in replicas)
    gw = Gateway(
        f"engine.vllm.base_urls=[{urls}]",
        "engine.vllm.slots_per_replica=2",
        "engine.vllm.poll_interval_s=3600",
        profile="prod",
    ).wait_ready()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def http(gateway):
    with httpx.Client(base_url=gateway.url, timeout=120) as client:
        yield client


def requests_by(http: httpx.Client) -> dict[tuple[str, str], float]:
    """``ocrserve_vllm_requests_total`` from the gateway's /metrics: (replica, outcome) -> count."""
    counts = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        if family.name == "ocrserve_vllm_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["replica"], sample.labels["outcome"]] = sample.value
    return counts


def ocr(http: httpx.Client, data: bytes, name: str) -> httpx.Response:
    return http.post("/v1/ocr", files={"file": (name, data)})


def test_pages_come_back_right_and_spread_across_both_replicas(http, replicas):
    before = requests_by(http)
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda name: ocr(http, (DATA / name).read_bytes(), name), DOCUMENTS))
    for name, response in zip(DOCUMENTS, responses, strict=True):
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == MODEL
        assert bag_f1(body["text"], ground_truth(name)) >= DOCUMENTS[name], (name, body["text"])
        for page in body["pages"]:
            w, h = page["width"], page["height"]
            assert page["lines"] and all(line["box"] == [[0, 0], [w, 0], [w, h], [0, h]] for line in page["lines"])
            assert "\n".join(line["text"] for line in page["lines"]) == page["text"]
    assert (responses[0].json()["pages"][0]["width"], responses[0].json()["pages"][0]["height"]) == (640, 480)
    after = requests_by(http)
    served = {r.url: after.get((r.url, "ok"), 0) - before.get((r.url, "ok"), 0) for r in replicas}
    assert sum(served.values()) == 5 and all(n >= 1 for n in served.values()), served
    for replica in replicas:  # each replica counted what it served, under vLLM's metric name
        assert read_vllm_metrics(httpx.get(replica.url + "/metrics").text) == {
            "waiting": 0.0,
            "running": 0.0,
            "kv_cache_usage": 0.0,
        }
        assert "vllm:request_success_total" in httpx.get(replica.url + "/metrics").text


def test_gateway_polls_replicas_into_its_metrics_and_models(http, replicas):
    (entry,) = http.get("/v1/models").json()["data"]
    assert entry["id"] == MODEL and entry["slots"] == 4 and entry["ready"] is True
    assert [r["url"] for r in entry["replicas"]] == [r.url for r in replicas]
    exposition = http.get("/metrics").text
    for replica in replicas:
        assert f'ocrserve_vllm_replica_up{{replica="{replica.url}"}} 1.0' in exposition
        assert f'ocrserve_vllm_kv_cache_usage_ratio{{replica="{replica.url}"}} 0.0' in exposition
        assert f'ocrserve_vllm_requests_waiting{{replica="{replica.url}"}} 0.0' in exposition


def test_a_400_from_the_engine_fails_the_page_without_a_retry(http):
    before = requests_by(http)
    big = samples.phototest().resize((2400, 1800))  # 4.3 Mpx -> 4.1 Mpx at the prod budget
    response = ocr(http, samples.encode(big, "PNG"), "big.png")
    assert response.status_code == 422, response.text  # the page's own fault: not 502, which clients retry
    assert "answered 400" in response.json()["detail"] and "max_page_pixels" in response.json()["detail"]
    after = requests_by(http)
    sent = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}
    assert list(sent.values()) == [1] and list(sent)[0][1] == "error", sent


def test_engine_server_speaks_the_openai_protocol(replicas):
    replica = replicas[0]
    uri = image_data_uri(np.asarray(samples.phototest()))
    body = completion_request(get_model(MODEL), "text", uri, model=MODEL, priority=5)
    done = httpx.post(replica.url + "/v1/chat/completions", json=body, timeout=60)
    assert done.status_code == 200
    completion = done.json()
    assert completion["object"] == "chat.completion" and completion["model"] == MODEL
    assert completion["system_fingerprint"] == done.headers[REPLICA_HEADER]
    assert completion["system_fingerprint"].endswith(f":{replica.port}")
    assert completion["choices"][0]["message"]["content"].startswith("This is a lot of 12 point text")
    wrong = httpx.post(replica.url + "/v1/chat/completions", json={**body, "model": "other"})
    assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"
    no_image = {**body, "messages": [{"role": "user", "content": "hello"}]}
    refused = httpx.post(replica.url + "/v1/chat/completions", json=no_image)
    assert refused.status_code == 400 and "image_url" in refused.json()["error"]["message"]
    broken = {
        **body,
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"no").decode()},
                    }
                ],
            }
        ],
    }
    assert httpx.post(replica.url + "/v1/chat/completions", json=broken).status_code == 400
    assert httpx.get(replica.url + "/v1/models").json()["data"][0]["id"] == MODEL


def replica_load(replicas: list[Replica]) -> tuple[float, float, float]:
    """Summed over the replicas: requests running, finished with ``stop``, finished with ``abort``."""
    running = stopped = aborted = 0.0
    for replica in replicas:
        for family in text_string_to_metric_families(httpx.get(replica.url + "/metrics").text):
            for sample in family.samples:
                if sample.name == "vllm:num_requests_running":
                    running += sample.value
                elif sample.name == "vllm:request_success_total":
                    reason = sample.labels["finished_reason"]
                    stopped += sample.value if reason == "stop" else 0
                    aborted += sample.value if reason == "abort" else 0
    return running, stopped, aborted


def test_a_client_gone_mid_page_aborts_it_in_the_engine(gateway, http, replicas):
    """A synchronous client disconnects while its page runs in a replica: the gateway cancels the
    page, the request's connection to the replica closes, and the replica aborts it (vLLM's
    ``finished_reason="abort"``), freeing its slot before the page was read."""
    _, stopped, aborted = replica_load(replicas)
    image = np.tile(np.asarray(samples.phototest()), (3, 2, 1))  # 1280 x 1440: seconds of ONNX work
    files = {"file": ("big.png", samples.encode(Image.fromarray(image), "PNG"))}
    post_then_hang_up(gateway.url + "/v1/ocr", files, lambda: replica_load(replicas)[0] == 1)  # mid-page
    wait_for(lambda: replica_load(replicas)[0] == 0)
    assert replica_load(replicas)[1:] == (stopped, aborted + 1)  # aborted there, not finished
    gone = [
        s
        for f in text_string_to_metric_families(http.get("/metrics").text)
        for s in f.samples
        if s.name == "ocrserve_engine_aborted_pages_total" and s.labels["reason"] == "cancelled"
    ]
    assert sum(s.value for s in gone) >= 1


def test_a_dead_replica_is_retried_on_the_other(http, replicas):
    live, dead = replicas
    dead.stop()
    before = requests_by(http)
    for _ in range(2):  # picks rotate: one of two consecutive pages goes to the dead replica
        response = ocr(http, (DATA / "phototest.tif").read_bytes(), "phototest.tif")
        assert response.status_code == 200, response.text
        assert response.json()["text"].startswith("This is a lot of 12 point text")
    after = requests_by(http)
    assert after[dead.url, "unavailable"] - before.get((dead.url, "unavailable"), 0) >= 1
    assert after[live.url, "ok"] - before.get((live.url, "ok"), 0) == 2


# --- request recipe and reply reading (pure functions of the registry) ---------------------------


def _page(width: int = 1000, height: int = 800) -> Page:
    return Page(
        index=0, image=np.zeros((height // 2, width // 2, 3), np.uint8), width=width, height=height, visual_tokens=0
    )


def test_hunyuan_request_follows_the_model_card():
    body = completion_request(get_model(MODEL), "text", "data:image/png;base64,AA==", model=MODEL, priority=3)
    system, user = body["messages"]
    assert system == {"role": "system", "content": ""}
    assert [part["type"] for part in user["content"]] == ["image_url", "text"]
    assert user["content"][1]["text"] == "提取图中的文字。"
    assert (body["temperature"], body["top_k"], body["repetition_penalty"], body["max_tokens"]) == (
        0.0,
        -1,
        1.08,
        16384,
    )
    assert body["priority"] == 3
    assert "priority" not in completion_request(get_model(MODEL), "text", "x", model=MODEL, priority=None)
    olmocr = completion_request(get_model("allenai/olmOCR-2-7B-1025"), "text", "x", model="m", priority=None)
    assert [part["type"] for part in olmocr["messages"][0]["content"]] == ["text", "image_url"]


def test_every_registry_model_has_its_clean_up():
    assert {spec.postprocess for spec in REGISTRY.values()} <= set(CLEANERS)


def test_reply_lines_fences_and_front_matter():
    page = _page()
    text, lines, _ = read_reply(get_model(MODEL), "```markdown\n# Title\n\nBody line\n```", page)
    assert text == "# Title\n\nBody line"
    assert [line.text for line in lines] == ["# Title", "Body line"]
    assert lines[0].box == [[0, 0], [1000, 0], [1000, 800], [0, 800]] and lines[0].score == 1.0
    olm = "---\nprimary_language: en\nis_table: false\n---\nHello world"
    assert read_reply(get_model("allenai/olmOCR-2-7B-1025"), olm, page)[0] == "Hello world"


def test_hunyuan_degenerate_tail_is_cut_to_one_copy():
    reply = "x" * 8000 + "ab" * 50
    text, _, _ = read_reply(get_model(MODEL), reply, _page())
    assert text == "x" * 8000 + "ab"
    assert read_reply(get_model(MODEL), "ab" * 50, _page())[0] == "ab" * 50  # short replies untouched


def test_deepseek_grounding_gives_boxes_in_client_pixels():
    reply = (
        "<|ref|>title<|/ref|><|det|>[[0, 0, 999, 99]]<|/det|>\n# Report\n\n"
        "<|ref|>text<|/ref|><|det|>[[99, 499, 499, 999]]<|/det|>\nFirst line\nSecond line"
    )
    text, lines, blocks = read_reply(get_model("deepseek-ai/DeepSeek-OCR"), reply, _page(999, 1998))
    assert text == "# Report\n\nFirst line\nSecond line"
    assert [line.text for line in lines] == ["# Report", "First line", "Second line"]
    assert [line.block for line in lines] == [0, 1, 1] and [b["lines"] for b in blocks] == [[0], [1, 2]]
    assert lines[0].box == [[0, 0], [999, 0], [999, 198], [0, 198]]
    assert lines[2].box == [[99, 998], [499, 998], [499, 1998], [99, 1998]]


def test_dots_layout_json_gives_boxes_scaled_from_the_model_image():
    reply = (
        '[{"bbox": [10, 20, 110, 40], "category": "Title", "text": "Heading"}, '
        '{"bbox": [10, 50, 300, 90], "category": "Picture"}]'
    )
    text, lines, _ = read_reply(get_model("rednote-hilab/dots.ocr"), reply, _page())  # model saw 500 x 400
    assert text == "Heading"
    assert lines[0].box == [[20, 40], [220, 40], [220, 80], [20, 80]]
    plain, lines, _ = read_reply(get_model("rednote-hilab/dots.ocr"), "just text", _page())
    assert plain == "just text" and lines[0].box == [[0, 0], [1000, 0], [1000, 800], [0, 800]]


def test_a_vlms_located_blocks_are_put_in_reading_order():
    """dots.ocr lists a two-column page's cells as it likes: the shared ordering code reads the
    title, then the left column, then the right."""
    cells = [("Right column", [260, 60, 480, 300]), ("Title", [20, 10, 480, 40]), ("Left column", [20, 60, 240, 300])]
    reply = json.dumps([{"bbox": box, "category": "Text", "text": text} for text, box in cells])
    text, lines, blocks = read_reply(get_model("rednote-hilab/dots.ocr"), reply, _page())
    assert text == "Title\n\nLeft column\n\nRight column"
    assert [line.block for line in lines] == [0, 1, 2] and len(blocks) == 3


def test_vllm_metrics_and_base_urls():
    exposition = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 2.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75\n'
    )
    assert read_vllm_metrics(exposition) == {"waiting": 5.0, "kv_cache_usage": 0.75}
    assert server_root("http://gpu1:8001/v1/") == server_root("http://gpu1:8001") == "http://gpu1:8001"


def test_inference_time_between_polls_prices_other_clients_queue():
    """vLLM's ``request_inference_time_seconds`` between two polls is how long its requests ran;
    the requests other clients queue there are priced with it, over the batch vLLM ran."""

    def exposition(seconds: float, count: int, running: int, waiting: int) -> str:
        return (
            "# TYPE vllm:request_inference_time_seconds histogram\n"
            f'vllm:request_inference_time_seconds_bucket{{le="+Inf",model_name="m"}} {count}\n'
            f'vllm:request_inference_time_seconds_count{{model_name="m"}} {count}\n'
            f'vllm:request_inference_time_seconds_sum{{model_name="m"}} {seconds}\n'
            f'vllm:num_requests_running{{model_name="m"}} {running}\n'
            f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
        )

    first = read_vllm_metrics(exposition(10.0, 4, 0, 0))
    assert first == {"inference_s_sum": 10.0, "inference_count": 4.0, "running": 0.0, "waiting": 0.0}
    replica = VllmReplica("http://gpu1:8001", up=True, outstanding=2)
    replica.record_load(first)
    assert replica.request_s == 2.5 and replica.foreign_waiting() == 0
    replica.record_load(read_vllm_metrics(exposition(10.0, 4, 4, 6)))  # nothing finished: kept
    assert replica.request_s == 2.5
    replica.record_load(read_vllm_metrics(exposition(34.0, 6, 4, 6)))  # 2 requests, 24 s
    assert replica.request_s == 12.0
    # 10 requests in vLLM, 2 of them ours: the 6 waiting are others'; 6 x 12 s over a batch of 4
    assert replica.foreign() == 8 and replica.foreign_waiting() == 6 and replica.drain_s() == 18.0
    replica.outstanding = 8  # ours fill the batch and wait there too: 2 of the waiting are others'
    assert replica.foreign() == 2 and replica.foreign_waiting() == 2 and replica.drain_s() == 6.0
    replica.record_load(read_vllm_metrics(exposition(1.0, 1, 0, 0)))  # vLLM restarted: counters anew
    assert replica.request_s == 12.0 and replica.inference_seen == (1.0, 1.0)


def test_other_clients_requests_running_in_vllm_count_as_inside_it():
    """Other clients' requests that vLLM runs, not only those it queues, are inside the engine (the
    router is not vacant beside them, and runs no probe there); a replica that is down counts none."""
    engine = VllmEngine(
        load_config("prod", ["engine.vllm.base_urls=[http://gpu1:8001,http://gpu2:8001]", "vllm.max_num_seqs=4"])
    )
    up, down = engine.replicas
    up.up, up.outstanding, down.outstanding = True, 1, 0
    up.record_load({"running": 3.0, "waiting": 0.0})
    down.record_load({"running": 5.0, "waiting": 2.0})
    assert engine.queued_inside() == (0, None) and engine.others_inside() == 2.0
    up.outstanding = 3  # all running there are ours
    assert engine.others_inside() == 0.0


# --- a replica that was up and is gone ---------------------------------------------------------


@pytest.mark.slow
def test_with_its_only_replica_killed_the_503_names_it_and_jobs_wait(tmp_path):
    """The gateway's only replica is killed: a synchronous request's 503 says which replica is
    down, since when and why (not "still loading"), with Retry-After from the poll interval;
    /v1/models shows it down; a job submitted meanwhile is accepted and waits, and finishes once
    a replica answers on that address again."""
    replica = Replica(MODEL).wait_healthy()
    gw = Gateway(
        f"engine.vllm.base_urls=[{replica.url}]",
        "engine.vllm.slots_per_replica=2",
        "engine.vllm.poll_interval_s=0.5",
        f"store.data_dir={tmp_path}",
        profile="prod",
    )
    try:
        http = httpx.Client(base_url=gw.wait_ready().url, timeout=120)
        (entry,) = http.get("/v1/models").json()["data"]
        (state,) = entry["replicas"]
        assert state["up"] is True and state["reason"] is None and state["since"].endswith("Z")
        assert http.get("/readyz").json()["replicas"][0]["up"] is True
        replica.proc.kill()  # SIGKILL: gone at once, no goodbye
        replica.proc.wait(30)
        # the poll that finds it gone may see its keep-alive connection reset; the next ones, refused
        wait_for(lambda: "(connection refused)" in http.get("/readyz").text)
        refused = ocr(http, (DATA / "phototest.tif").read_bytes(), "phototest.tif")
        stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
        body = assert_problem(
            refused, 503, rf"no vLLM replica is up: {replica.url} down since {stamp} \(connection refused\)"
        )
        assert "loading" not in body["detail"] and body["type"].endswith("/engine-down")
        assert refused.headers["retry-after"] == "1"  # poll_interval_s 0.5, rounded up
        (state,) = http.get("/v1/models").json()["data"][0]["replicas"]
        assert state["up"] is False and state["reason"] == "connection refused" and state["since"] in body["detail"]
        job = http.post("/v1/jobs", files={"file": ("phototest.tif", (DATA / "phototest.tif").read_bytes())})
        assert job.status_code == 202, job.text
        time.sleep(2)  # several polls: the job's page waits instead of failing
        assert http.get(job.headers["location"]).json()["status"] == "queued"
        replica = Replica(MODEL, port=replica.port).wait_healthy()  # back on the same address
        done = wait_for(
            lambda: (s := http.get(job.headers["location"]).json())["status"] not in ("queued", "running") and s
        )
        assert done["status"] == "succeeded", done
        assert ocr(http, (DATA / "phototest.tif").read_bytes(), "phototest.tif").status_code == 200
    finally:
        gw.stop()
        replica.stop()


@pytest.mark.slow
def test_a_replica_never_up_is_still_loading_not_down(tmp_path):
    """A replica that never answered: the 503 says the engine is still loading and why."""
    dead = f"http://127.0.0.1:{free_port()}"
    gw = Gateway(
        f"engine.vllm.base_urls=[{dead}]",
        "engine.vllm.slots_per_replica=2",
        "engine.vllm.poll_interval_s=2",
        f"store.data_dir={tmp_path}",
        profile="prod",
    )
    try:
        wait_for(lambda: "connection refused" in _answer(gw.url + "/readyz"))  # polled once at least
        refused = httpx.post(gw.url + "/v1/ocr", files={"file": ("p.tif", (DATA / "phototest.tif").read_bytes())})
        body = assert_problem(
            refused, 503, rf"still loading: no vLLM replica has come up yet: {dead} not up yet \(connection refused;"
        )
        assert body["type"].endswith("/engine-unavailable") and refused.headers["retry-after"] == "2"
        # the client retries after Retry-After, then stops the run with one line: every document would fail
        docs = tmp_path / "docs"
        docs.mkdir()
        for n in range(4):
            (docs / f"d{n}.tif").write_bytes((DATA / "phototest.tif").read_bytes())
        done = subprocess.run(
            [sys.executable, "-m", "ocrserve", "ocr", str(docs), "--url", gw.url, "--out", str(tmp_path / "res")],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert done.returncode == 3, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(f"error: the gateway at {gw.url} has no OCR engine up (503 Engine unavailable: ")
        assert lines[0].endswith("; stopping here.") and dead in lines[0]
        assert "0 done, 0 skipped (already in" in done.stderr and "run the same command again" in done.stderr
    finally:
        gw.stop()


def _answer(url: str) -> str:
    """The body ``url`` answers with, "" while nothing listens."""
    try:
        return httpx.get(url, timeout=2).text
    except httpx.TransportError:
        return ""
