"""Logs an operator can use: one ready line, request ids (header, problem bodies, every log line),
probes out of the access log, JSON lines, and a gateway command that sets each key once.

Two real gateways on loopback, their output in a file: the default one (text lines, probes
dropped) and one with ``server.log_format=json`` and ``server.log_probes=true``.
"""

from __future__ import annotations

import json
import re
import uuid

import httpx
import pytest
from typer.testing import CliRunner

from ocrserve.cli import app
from ocrserve.config import ConfigError, load_config
from ocrserve.gateway import gateway_command
from ocrserve.logs import MAX_REQUEST_ID
from tests.conftest import DATA, Gateway, wait_for

PROBES = ("/healthz", "/readyz", "/metrics")


def started(tmp_path_factory, *overrides: str) -> tuple[Gateway, object]:
    folder = tmp_path_factory.mktemp("logs")
    log = folder / "gateway.log"
    return Gateway(f"store.data_dir={folder}", *overrides, log_file=log).wait_ready(), log


@pytest.fixture(scope="module")
def text_gateway(tmp_path_factory):
    """A gateway with the default log settings, and its log file."""
    gateway, log = started(tmp_path_factory)
    yield gateway, log
    gateway.stop()


@pytest.fixture(scope="module")
def json_gateway(tmp_path_factory):
    """A gateway logging JSON lines, probes included, and its log file."""
    gateway, log = started(tmp_path_factory, "server.log_format=json", "server.log_probes=true")
    yield gateway, log
    gateway.stop()


def logged(log, needle: str) -> str:
    """The log's text once it holds ``needle`` (lines are written as the gateway answers)."""

    def text() -> str:
        content = log.read_text()
        return content if needle in content else ""

    return wait_for(text, timeout=10)


def test_a_request_id_is_taken_when_plain_and_made_otherwise(text_gateway):
    gateway, _ = text_gateway
    with httpx.Client(base_url=gateway.url) as client:
        assert client.get("/healthz", headers={"X-Request-ID": "lb-7f3a:01"}).headers["X-Request-ID"] == "lb-7f3a:01"
        made = [client.get("/healthz").headers["X-Request-ID"] for _ in range(2)]
        refused = ["two words", 'quote"', "a" * (MAX_REQUEST_ID + 1), "ü".encode()]
        made += [client.get("/healthz", headers={"X-Request-ID": sent}).headers["X-Request-ID"] for sent in refused]
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in made) and len(set(made)) == len(made)
    longest = "b" * MAX_REQUEST_ID
    assert httpx.get(gateway.url + "/healthz", headers={"X-Request-ID": longest}).headers["X-Request-ID"] == longest


def test_a_problem_body_names_the_request(text_gateway):
    gateway, _ = text_gateway
    response = httpx.get(gateway.url + "/v1/jobs/nope", headers={"X-Request-ID": "problem-1"})
    assert response.status_code == 404 and response.headers["content-type"] == "application/problem+json"
    assert response.json()["request_id"] == "problem-1" == response.headers["X-Request-ID"]
    made = httpx.post(gateway.url + "/v1/ocr", files={"file": ("x.png", b"not an image")})
    assert made.status_code == 415 and made.json()["request_id"] == made.headers["X-Request-ID"]


def test_text_lines_carry_the_request_id_and_leave_out_probes(text_gateway):
    gateway, log = text_gateway
    marker = uuid.uuid4().hex
    for path in PROBES:
        assert httpx.get(gateway.url + path).status_code == 200
    with httpx.Client(base_url=gateway.url, timeout=120) as client:
        files = {"file": ("phototest.tif", (DATA / "phototest.tif").read_bytes())}
        assert client.post("/v1/ocr", files=files, headers={"X-Request-ID": marker}).status_code == 200
    text = logged(log, marker)
    (line,) = [line for line in text.splitlines() if marker in line]
    assert re.search(rf" INFO uvicorn\.access \[{marker}\] 127\.0\.0\.1:\d+ - \"POST /v1/ocr HTTP/1\.1\" 200$", line)
    assert not [line for line in text.splitlines() if any(f'"GET {path} ' in line for path in PROBES)]


def test_one_line_says_the_gateway_is_ready_and_what_it_serves(text_gateway):
    gateway, log = text_gateway
    ready = [line for line in log.read_text().splitlines() if " ready on " in line]
    assert len(ready) == 1, ready
    assert f"ready on {gateway.url}: profile local, engine onnx rapidocr/PP-OCRv6-small, " in ready[0]
    assert re.search(r"\d+ slots .*router lanes \(fast: .*bulk: .*\), jobs in sqlite .*jobs\.db$", ready[0])


def test_json_lines_parse_and_carry_the_request_id_with_probes_kept(json_gateway):
    gateway, log = json_gateway
    marker = uuid.uuid4().hex
    assert httpx.get(gateway.url + "/healthz").status_code == 200
    assert httpx.get(gateway.url + "/v1/jobs/nope", headers={"X-Request-ID": marker}).status_code == 404
    text = logged(log, marker)
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert all({"time", "level", "logger", "request_id", "message"} <= set(r) for r in records)
    (access,) = [r for r in records if r["request_id"] == marker]
    assert access["logger"] == "uvicorn.access" and (access["method"], access["path"], access["status"]) == (
        "GET",
        "/v1/jobs/nope",
        404,
    )
    assert [r for r in records if r.get("path") == "/healthz"]  # server.log_probes=true keeps them
    (ready,) = [r for r in records if r["message"].startswith("ready on ")]
    assert (ready["profile"], ready["engine"], ready["url"], ready["request_id"]) == (
        "local",
        "onnx",
        gateway.url,
        None,
    )


def test_log_settings_are_validated():
    with pytest.raises(ConfigError, match="server.log_format"):
        load_config("local", ["server.log_format=xml"])


def test_the_printed_gateway_command_sets_each_key_once():
    config = load_config("prod", ["engine.vllm.base_urls=[http://gpu1:8001]", "engine.vllm.slots_per_replica=4"])
    user = ["preprocess.workers=1", "engine.vllm.base_urls=[http://old:1]", "preprocess.workers=2"]
    argv = gateway_command(config, user)
    sets = [argv[n + 1] for n, arg in enumerate(argv) if arg == "--set"]
    assert sets == [
        "preprocess.workers=2",
        "engine.vllm.base_urls=[http://gpu1:8001]",
        "engine.vllm.slots_per_replica=4",
    ]
    result = CliRunner().invoke(
        app,
        [
            "launch",
            "--dry-run",
            "--set",
            "preprocess.workers=1",
            "--set",
            "router.calibrate=false",
            "--set",
            "preprocess.workers=3",
        ],
    )
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("gateway:")]
    assert line.endswith("--set router.calibrate=false --set preprocess.workers=3"), line
