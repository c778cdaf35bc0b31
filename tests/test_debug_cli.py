"""``ocrserve debug`` (issue 11, part 4) on a tiny random-weight HunyuanOCR, without and with a gateway.

The model (:mod:`tests.tiny_hunyuan`, ``looping=True``: greedy decoding repeats ``G``) is built into
a temp folder; nothing is downloaded. ``--compare`` talks to a real gateway on the ``debug`` profile
serving the same folder, so both sides must agree exactly (CER 0). Needs the debug extra.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

pytest.importorskip("torch", reason="debug mode needs torch: pip install -e '.[debug]'")
pytest.importorskip("transformers", minversion="5.13", reason="HunYuanVL: pip install -e '.[debug]'")

from typer.testing import CliRunner  # noqa: E402

from ocrserve.cli import app  # noqa: E402
from tests.conftest import DATA, Gateway  # noqa: E402
from tests.tiny_hunyuan import build_tiny_hunyuan  # noqa: E402

TOKENS = 16
SETTINGS = [f"engine.transformers.max_new_tokens={TOKENS}", "engine.transformers.threads=1"]
PHOTOTEST = str(DATA / "phototest.tif")
runner = CliRunner(env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(build_tiny_hunyuan(tmp_path_factory.mktemp("tiny-hunyuan-loop"), looping=True))


def debug(*args: str):
    sets = [x for s in SETTINGS for x in ("--set", s)]
    return runner.invoke(app, ["debug", *args, *sets])


def row(output: str, stage: str) -> str:
    """The table row of ``stage`` (its first line)."""
    match = re.search(rf"│ {re.escape(stage)}\s+│(.*)│", output)
    assert match, f"no {stage!r} row in:\n{output}"
    return match.group(1)


def seconds(cells: str) -> float:
    return float(re.search(r"([0-9.]+) s", cells).group(1))


def test_prints_the_stage_table(tiny):
    result = debug(PHOTOTEST, "--model", tiny)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "640x480 px" in row(out, "decode")
    assert "budget 512²..2048² px, factor 32 -> 640x480 (307,200 px)" in row(out, "normalize")
    assert "HunYuanVLForConditionalGeneration, 190,816 params, cpu float32" in row(out, "load + warm-up")
    assert "317 image tokens, 346 prompt tokens" in row(out, "processor")
    assert seconds(row(out, "prefill")) > 0
    decode_rows = re.findall(r"│ decode\s+│(.*)│", out)
    assert len(decode_rows) == 2  # the image's and the tokens'
    tokens = re.search(r"([0-9]+) new tokens, ([0-9.,]+) tokens/s", decode_rows[1])  # 1,140.2 on a fast run
    assert tokens and int(tokens.group(1)) == TOKENS and float(tokens.group(2).replace(",", "")) > 0
    peak = re.search(r"([0-9,.]+) MiB \(rss\)", row(out, "peak memory"))
    assert peak and float(peak.group(1).replace(",", "")) > 50
    assert "cut by max_new_tokens; retried with repetition_penalty=1.15" in row(out, "first try")
    assert seconds(row(out, "first try")) > 0
    assert "finish_reason: length (cut by max_new_tokens; the reply of the retry (see 'first try'))" in out
    assert "G" * TOKENS in out


def test_json_has_the_same_fields(tiny):
    result = debug(PHOTOTEST, "--model", tiny, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    stages = report["stages"]
    assert set(stages) == {
        "decode",
        "normalize",
        "load",
        "encode",
        "processor",
        "prefill",
        "decode_tokens",
        "peak_memory",
        "first_try",
    }
    assert stages["normalize"]["size"] == [640, 480]
    assert (stages["processor"]["image_tokens"], stages["processor"]["prompt_tokens"]) == (317, 346)
    assert stages["decode_tokens"]["new_tokens"] == TOKENS and stages["decode_tokens"]["tokens_per_s"] > 0
    assert stages["prefill"]["s"] > 0 and stages["peak_memory"]["kind"] == "rss"
    assert stages["peak_memory"]["bytes"] > 50 * 2**20
    assert (report["finish_reason"], report["text"], report["page"]) == ("length", "G" * TOKENS, 1)
    # the same fields as the gateway's page result, plus what the retry changed
    assert (report["truncated"], report["retried"]) == (True, True)
    assert report["retry_sampling"] == {"repetition_penalty": 1.15}
    # decode_tokens is the retry's own: its rate follows from its own tokens and seconds
    decode = stages["decode_tokens"]
    assert decode["tokens_per_s"] == pytest.approx((TOKENS - 1) / decode["s"], rel=0.02)


def test_compare_with_a_gateway(tiny):
    gw = Gateway(f"engine.model={tiny}", *SETTINGS, profile="debug").wait_ready()
    try:
        table = debug(PHOTOTEST, "--model", tiny, "--compare", gw.url)
        report = debug(PHOTOTEST, "--model", tiny, "--compare", gw.url, "--json")
    finally:
        gw.stop()
    assert table.exit_code == 0, table.output
    assert "model or serving?" in table.stdout
    assert f"debug: {tiny}" in table.stdout and f"gateway: {gw.url}" in table.stdout
    assert table.stdout.count("G" * TOKENS) == 2  # side by side
    assert "CER of the gateway's text against the debug engine's: 0.00% (identical)" in table.stdout
    assert report.exit_code == 0, report.output
    compare = json.loads(report.stdout)["compare"]
    assert (compare["text"], compare["cer"], compare["finish_reason"]) == ("G" * TOKENS, 0.0, "length")
    assert compare["same_model"] is True and "may differ by model" not in table.stdout


def test_compare_with_a_gateway_serving_another_model_says_so(tiny):
    gw = Gateway().wait_ready()  # the local profile: the ONNX engine
    try:
        table = debug(PHOTOTEST, "--model", tiny, "--compare", gw.url)
    finally:
        gw.stop()
    assert table.exit_code == 0, table.output
    out = " ".join(table.stdout.split())
    assert f"note: the gateway serves rapidocr/PP-OCRv6-small, not {tiny}: the texts may differ by model" in out
    assert "The quick brown dog" in out  # the ONNX engine's real reading of phototest


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("127.0.0.1:9", "--compare http://127.0.0.1:9: the gateway does not answer /healthz: ConnectError"),
        ("ftp://example.org", "--compare ftp://example.org: not an http:// or https:// URL"),
    ],
)
def test_a_compare_url_that_cannot_work_fails_before_the_local_run(tiny, url, message):
    result = debug(PHOTOTEST, "--model", tiny, "--compare", url, "--json")
    assert result.exit_code == 2 and result.stdout == ""  # no local run
    assert message in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tests/data/no-such-file.png"], "no such file"),
        ([PHOTOTEST, "--page", "2"], "has 1 page(s); --page 2 is out of range"),
        ([PHOTOTEST, "--model", "/no/such/model"], "engine.model: no such model folder: '/no/such/model'"),
        ([PHOTOTEST, "--model", "tests"], "engine.model: 'tests' holds no config.json"),
        ([PHOTOTEST, "--set", "engine.transformers.device=tpu"], "engine.transformers.device='tpu': Expected one of"),
        ([PHOTOTEST, "--set", "engine.transformers.device=cuda:99"], "engine.transformers.device='cuda:99': torch"),
        ([PHOTOTEST, "--set", "engine.transformers.device=mps"], "engine.transformers.device='mps': torch"),
        ([PHOTOTEST, "--set", "engine.transformers.attn_implementation=bogus"], "transformers knows eager,"),
        ([PHOTOTEST, "--set", "engine.kind=onnx"], "engine.kind is onnx (profile 'debug' with --set)"),
        (["tests/data"], "tests/data is a folder; give one image or PDF"),
        ([PHOTOTEST, "--profile", "local"], "needs the transformers engine"),
        ([str(DATA), "--model", "."], "is a folder"),
    ],
)
def test_bad_input_exits_2(tiny, args, message):
    result = debug(*args, *([] if "--model" in args else ["--model", tiny]))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())


def test_without_torch_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ocrserve.engines.transformers", None)  # import fails as without torch
    result = debug(PHOTOTEST)
    assert result.exit_code == 2
    assert "pip install -e '.[debug]'" in result.stderr
