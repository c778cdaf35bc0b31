"""Shared fixtures: test files, the corpus, and a real gateway (uvicorn) on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ground_truth(name: str) -> str:
    """The ``.gt.txt`` text beside a test file."""
    return (DATA / name).with_suffix(".gt.txt").read_text(encoding="utf-8")


class Gateway:
    """``ocrserve launch`` as a subprocess in its own process group."""

    def __init__(self, *overrides: str, profile: str = "local", env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "ocrserve", "launch", "--profile", profile, "--port", str(self.port),
                "--set", "preprocess.workers=1"]
        for item in overrides:
            args += ["--set", item]
        self.log = open(os.devnull, "wb") if not os.environ.get("OCRSERVE_TEST_LOGS") else None
        self.proc = subprocess.Popen(args, cwd=REPO, start_new_session=True, stdout=self.log, stderr=self.log,
                                     env={**os.environ, **(env or {})})

    def wait_ready(self, timeout: float = 180.0) -> "Gateway":
        """Block until ``/readyz`` answers 200. Raises RuntimeError if the process exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError("gateway not ready in time")

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL if it lingers."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.log:
            self.log.close()


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
    path = Path(os.environ.get("OCRSERVE_CORPUS", REPO.parent / "shared" / "corpus"))
    if not (path / "index.json").is_file():
        pytest.skip(f"corpus not found at {path} (set OCRSERVE_CORPUS); these tests need the real documents")
    return path
