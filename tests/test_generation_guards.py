"""The generation guards of the VLM engines (issue 11, part 6), on the ``vllm`` engine against a
real HTTP server speaking vLLM's streaming protocol (:class:`tests.fake_vllm.ScriptedVllm`):

* a reply whose tail starts looping is cut by HunyuanOCR's repetition rule (thresholds from
  ``engine.repeat_guard``, shared with the debug engine), reported as ``repetition``, and the
  stream is closed so the server aborts the request;
* a reply cut by ``max_tokens`` is retried once with the model card's stronger guard
  (``retry_sampling``) and reported ``retried``; still cut, ``truncated``;
* a normal reply is unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest

from ocrserve.config import RepeatGuardConfig, load_config
from ocrserve.engines.chat import RepeatWatch, retry_sampling
from ocrserve.engines.vllm import VllmEngine
from ocrserve.models import get_model
from ocrserve.pages import Page
from tests.conftest import wait_for
from tests.fake_vllm import Scripted, ScriptedVllm

MODEL = "tencent/HunyuanOCR"
#: Small thresholds: check from 200 characters, every 50, the last 400, 8 repeats.
SMALL_GUARD = [
    "engine.repeat_guard.start_chars=200",
    "engine.repeat_guard.every_chars=50",
    "engine.repeat_guard.window_chars=400",
    "engine.repeat_guard.min_count=8",
]
NORMAL = "The quick brown fox\njumps over the lazy dog"


def _page() -> Page:
    return Page(index=0, image=np.full((64, 64, 3), 255, np.uint8), width=64, height=64, visual_tokens=4)


async def _ocr(server: ScriptedVllm, *overrides: str):
    config = load_config(
        "prod",
        [
            f"engine.model={MODEL}",
            f"engine.vllm.base_urls=[{server.url}]",
            "engine.vllm.slots_per_replica=2",
            "engine.vllm.poll_interval_s=3600",
            *overrides,
        ],
        environ={},
    )
    engine = VllmEngine(config)
    await engine.start()
    try:
        return await engine.ocr_page(_page())
    finally:
        await engine.close()


async def test_a_normal_reply_is_streamed_unchanged():
    with ScriptedVllm(MODEL, [Scripted(NORMAL)], chunk_chars=3) as server:
        result = await _ocr(server, *SMALL_GUARD)
        (body,) = server.requests
        assert body["stream"] is True and body["repetition_penalty"] == 1.08
        assert server.finished == 1 and server.aborted == 0
    assert result.text == NORMAL
    assert [line.text for line in result.lines] == NORMAL.splitlines()
    assert result.generation == {"finish_reason": "stop", "truncated": False, "retried": False, "completion_tokens": 10}


async def test_a_looping_stream_is_cut_by_the_repetition_guard_and_aborted():
    looping = Scripted("Intro text that does not repeat. " * 3, loop="ab|")
    with ScriptedVllm(MODEL, [looping], chunk_chars=10) as server:
        result = await _ocr(server, *SMALL_GUARD)
        wait_for(lambda: server.aborted == 1, timeout=10)  # the server saw the client hang up
        sent = server.chunks_sent
        assert server.finished == 0 and len(server.requests) == 1  # not retried
    assert result.generation == {"finish_reason": "repetition", "truncated": False, "retried": False}
    assert result.text.startswith("Intro text") and "ab|" * 8 in result.text[-30:]
    assert 200 <= len(result.text) <= 400  # stopped at a check, long before anything else would
    assert sent < 60  # ~ the chars read / 10: the server stopped streaming soon after


async def test_the_default_guard_is_hunyuans_batch_rule():
    guard = load_config("prod", environ={}).engine.repeat_guard
    assert (guard.start_chars, guard.every_chars, guard.window_chars, guard.min_count) == (4000, 1000, 8000, 8)
    assert load_config("debug", environ={}).engine.repeat_guard == guard  # one setting, both engines
    assert not RepeatWatch(guard).check("ab" * 1999)  # 3,998 characters: not checked yet
    assert RepeatWatch(guard).check("".join(chr(0x4E00 + i) for i in range(4000)) + "ab" * 8)
    fresh = RepeatWatch(RepeatGuardConfig())
    assert not fresh.check("".join(chr(0x4E00 + i) for i in range(4100)))
    assert fresh.next_check == 5100


async def test_a_length_cut_reply_is_retried_once_with_the_stronger_guard():
    replies = [Scripted("cut off mid", finish_reason="length"), Scripted(NORMAL)]
    with ScriptedVllm(MODEL, replies) as server:
        result = await _ocr(server)
        first, second = server.requests
    assert first["repetition_penalty"] == 1.08 and second["repetition_penalty"] == 1.15
    assert {k: v for k, v in second.items() if k != "repetition_penalty"} == {
        k: v for k, v in first.items() if k != "repetition_penalty"
    }
    assert result.text == NORMAL
    assert result.generation == {"finish_reason": "stop", "truncated": False, "retried": True, "completion_tokens": 10}


async def test_a_reply_still_cut_after_the_retry_is_truncated():
    with ScriptedVllm(MODEL, [Scripted("cut off mid", finish_reason="length")]) as server:
        result = await _ocr(server)
        assert len(server.requests) == 2  # once retried, not more
    assert result.text == "cut off mid"
    assert result.generation == {"finish_reason": "length", "truncated": True, "retried": True, "completion_tokens": 2}


@pytest.mark.parametrize(
    ("model", "changed"),
    [("tencent/HunyuanOCR", {"repetition_penalty": 1.15}), ("allenai/olmOCR-2-7B-1025", {"temperature": 0.2})],
)
def test_retry_sampling_comes_from_the_registry(model, changed):
    spec = get_model(model)
    assert retry_sampling(spec, spec.sampling) == {**spec.sampling, **changed}
    assert spec.sources["retry_sampling"]
    assert retry_sampling(get_model("deepseek-ai/DeepSeek-OCR"), {"max_tokens": 1}) is None
