"""Debug mode (issue 11): the ``transformers`` engine on a tiny random-weight HunyuanOCR.

The model is HunyuanOCR's real architecture (``HunYuanVLForConditionalGeneration``) at toy sizes,
built into a temp folder by :mod:`tests.tiny_hunyuan`; nothing is downloaded. It is served by a
real gateway (``--profile debug --set engine.model=DIR``) on loopback, and driven in-process for
the guards. Needs the debug extra (torch, transformers >= 5.13).
"""

from __future__ import annotations

import logging
import threading
import time

import httpx
import numpy as np
import pytest

pytest.importorskip("torch", reason="debug mode needs torch: pip install -e '.[debug]'")
pytest.importorskip("transformers", minversion="5.13", reason="HunYuanVL: pip install -e '.[debug]'")

import huggingface_hub  # noqa: E402  (comes with transformers)
from transformers import AutoModelForImageTextToText  # noqa: E402

from ocrserve.config import load_config  # noqa: E402
from ocrserve.engines.transformers import TransformersEngine, generate_kwargs  # noqa: E402
from ocrserve.engines.vllm import VllmEngine  # noqa: E402
from ocrserve.pages import Page  # noqa: E402
from tests import samples  # noqa: E402
from tests.conftest import DATA, Gateway  # noqa: E402
from tests.tiny_hunyuan import build_tiny_hunyuan  # noqa: E402

#: Output tokens per page on the gateway: the random model never emits EOS, so every page ends at it.
GATEWAY_TOKENS = 48


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """The tiny model's folder (it repeats an invisible special token)."""
    return str(build_tiny_hunyuan(tmp_path_factory.mktemp("tiny-hunyuan")))


@pytest.fixture(scope="module")
def looping(tmp_path_factory) -> str:
    """The tiny model with special tokens suppressed: greedy decoding repeats ``G`` for ever."""
    return str(build_tiny_hunyuan(tmp_path_factory.mktemp("tiny-hunyuan-loop"), looping=True))


@pytest.fixture(scope="module")
def debug_gateway(tiny):
    gw = Gateway(
        f"engine.model={tiny}",
        f"engine.transformers.max_new_tokens={GATEWAY_TOKENS}",
        "engine.transformers.threads=1",
        profile="debug",
    ).wait_ready()
    yield gw
    gw.stop()


def readiness(url: str) -> str:
    """``/readyz``'s body, or ``""`` while the gateway does not listen yet."""
    try:
        return httpx.get(url + "/readyz", timeout=5).text
    except httpx.TransportError:
        return ""


def post_page(url: str) -> httpx.Response:
    data = (DATA / "phototest.tif").read_bytes()
    return httpx.post(url + "/v1/ocr", files={"file": ("phototest.tif", data)}, timeout=120)


def page(width: int = 640, height: int = 480) -> Page:
    """phototest as the debug profile's preprocessor leaves it (640 x 480: sides multiples of 32)."""
    image = np.asarray(samples.phototest().resize((width, height)))
    return Page(index=0, image=image, width=width, height=height, visual_tokens=0)


def test_gateway_serves_the_tiny_model(debug_gateway, tiny):
    response = post_page(debug_gateway.url)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == tiny
    result = body["pages"][0]
    assert {"queue_s", "preprocess_s", "engine_s", "encode_s", "processor_s", "prefill_s", "decode_s"} <= set(
        result["timings"]
    )
    generation = result["generation"]
    assert generation["finish_reason"] == "length"
    assert generation["new_tokens"] == GATEWAY_TOKENS
    assert generation["image_tokens"] == 317  # (480/32) * (640/32 + 1) + 2: the registry's grid formula
    assert generation["tokens_per_s"] > 0

    listing = httpx.get(debug_gateway.url + "/v1/models").json()["data"][0]
    parameters = sum(p.numel() for p in AutoModelForImageTextToText.from_pretrained(tiny).parameters())
    assert listing | {"parameters": parameters} == listing
    assert (listing["engine"], listing["device"], listing["dtype"], listing["slots"]) == (
        "transformers",
        "cpu",
        "float32",
        1,
    )
    assert listing["class"] == "HunYuanVLForConditionalGeneration"


def test_an_engine_that_fails_to_load_is_reported_as_such_not_as_loading(tmp_path):
    folder = build_tiny_hunyuan(tmp_path / "model")
    for weights in folder.glob("*.safetensors"):
        weights.write_bytes(b"\xff" * weights.stat().st_size)  # as large as real weights, but no safetensors
    gw = Gateway(f"engine.model={folder}", profile="debug")
    try:
        deadline = time.monotonic() + 120
        while "failed to start" not in readiness(gw.url):
            assert time.monotonic() < deadline, "the gateway never reported the failed load"
            time.sleep(0.5)
        response = post_page(gw.url)
    finally:
        gw.stop()
    assert response.status_code == 503 and response.headers["Retry-After"] == "60"
    detail = response.json()["detail"]
    assert (
        detail.startswith("the OCR engine failed to start: ValueError: engine.model=") and "SafetensorError" in detail
    )


def test_two_requests_never_run_at_once(debug_gateway):
    responses: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: responses.append(post_page(debug_gateway.url))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = []
    for response in responses:
        if response.status_code == 503:
            assert "Retry-After" in response.headers
        else:
            assert response.status_code == 200, response.text
            done.append(response.json()["pages"][0]["generation"])
    done.sort(key=lambda g: g["started_at"])
    for first, second in zip(done, done[1:], strict=False):
        assert second["started_at"] >= first["ended_at"]


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["engine.transformers.max_new_tokens=24"], "length"),
        (["engine.transformers.page_timeout_s=0.001"], "time"),
        (
            [
                "engine.transformers.max_new_tokens=2000",
                "engine.repeat_guard.start_chars=40",
                "engine.repeat_guard.every_chars=10",
                "engine.repeat_guard.window_chars=80",
            ],
            "repetition",
        ),
    ],
)
async def test_a_looping_generation_is_cut_and_says_why(looping, overrides, reason):
    engine = TransformersEngine(load_config("debug", [f"engine.model={looping}", *overrides]))
    await engine.start()
    try:
        result = await engine.ocr_page(page())
    finally:
        await engine.close()
    generation = result.generation
    assert generation["finish_reason"] == reason
    assert result.text == "G" * generation["new_tokens"]  # a cut page is a result, with its text so far
    if reason == "length":
        assert generation["new_tokens"] == 24
    if reason == "repetition":  # stopped at the first check past 40 characters, not at max_new_tokens
        assert 40 <= generation["new_tokens"] < 60
    if reason == "time":  # checked after each step: the first token always comes
        assert generation["new_tokens"] < 10


async def test_a_length_cut_page_is_retried_once_with_the_stronger_guard(looping, caplog):
    caplog.set_level(logging.INFO, "ocrserve.engines.transformers")
    engine = TransformersEngine(
        load_config("debug", [f"engine.model={looping}", "engine.transformers.max_new_tokens=8"])
    )
    await engine.start()
    try:
        result = await engine.ocr_page(page())
    finally:
        await engine.close()
    assert engine.spec.retry_sampling == {"repetition_penalty": 1.15}  # HunyuanOCR's entry
    generation = result.generation
    assert (generation["finish_reason"], generation["truncated"], generation["retried"]) == ("length", True, True)
    assert "cut by max_new_tokens; retrying once with {'repetition_penalty': 1.15}" in caplog.text


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache in ``tmp_path``; ``hf_cache(model_id)`` puts a model's
    ``config.json`` in it, laid out as ``hf download`` leaves it (no weights)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))

    def cache(model_id: str) -> None:
        repo = tmp_path / ("models--" + model_id.replace("/", "--"))
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("0" * 40)
        (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
        (repo / "snapshots" / ("0" * 40) / "config.json").write_text("{}")

    return cache


def test_a_model_not_in_the_cache_is_refused_before_loading(hf_cache, tmp_path):
    with pytest.raises(ValueError, match=r"tencent/HunyuanOCR is not in the Hugging Face cache \(.*\) and nothing"):
        TransformersEngine(load_config("debug", ["engine.model=HunyuanOCR"]))
    hf_cache("tencent/HunyuanOCR")
    assert TransformersEngine(load_config("debug", ["engine.model=HunyuanOCR"])).weights == "tencent/HunyuanOCR"


def test_both_engines_send_the_same_request(hf_cache):
    hf_cache("tencent/HunyuanOCR")
    page_ = page()
    prod = VllmEngine(
        load_config("prod", ["engine.vllm.base_urls=[http://127.0.0.1:9]", "engine.vllm.slots_per_replica=1"])
    )
    debug = TransformersEngine(load_config("debug"))
    body = prod._request_body(page_, 0)
    request = debug.request(page_)
    assert {k: v for k, v in body.items() if k not in ("model", "priority")} == request
    assert request["messages"][1]["content"][1]["text"] == "提取图中的文字。"
    assert request["messages"][1]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    sampling = {k: v for k, v in request.items() if k != "messages"}
    assert sampling == dict(debug.spec.sampling)
    assert (
        debug.sampling
        == generate_kwargs(sampling)
        == {
            "max_new_tokens": 16384,
            "do_sample": False,
            "repetition_penalty": 1.08,
        }
    )


def test_sampling_maps_onto_generate():
    assert generate_kwargs({"temperature": 0.1, "top_p": 0.9, "top_k": -1, "max_tokens": 8}, 4) == {
        "max_new_tokens": 4,
        "do_sample": True,
        "temperature": 0.1,
        "top_p": 0.9,
    }
