"""Start a gateway as a subprocess and summarize latencies; shared by benchmarks and tests."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ocrserve.quantiles import nearest_rank

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by the nearest-rank method; NaN for no values."""
    if not values:
        return math.nan
    return nearest_rank(sorted(values), q / 100)


class LocalGateway:
    """``python -m ocrserve launch`` in its own process group on a free loopback port.

    Args:
        overrides: ``key=value`` strings passed as ``--set``.
        profile: the profile to launch.
        env: extra environment variables.
        log: where the gateway's output goes (default: discarded; None: this process's own).
        repo: the checkout to launch (its ``ocrserve`` package, from its root), default this one.
    """

    def __init__(
        self,
        *overrides: str,
        profile: str = "local",
        env: dict | None = None,
        log=subprocess.DEVNULL,
        repo: Path = REPO,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "ocrserve", "launch", "--profile", profile, "--port", str(self.port)]
        for item in overrides:
            args += ["--set", item]
        self.proc = subprocess.Popen(
            args, cwd=repo, start_new_session=True, stdout=log, stderr=log, env={**os.environ, **(env or {})}
        )

    def wait_ready(self, timeout: float = 180.0) -> LocalGateway:
        """Block until ``/readyz`` answers 200.

        Raises:
            RuntimeError: the process exited, or ``timeout`` seconds passed.
        """
        wait_until_200(self.proc, self.url + "/readyz", "gateway", timeout)
        return self

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL if it lingers (:func:`stop_group`)."""
        stop_group(self.proc)

    def __enter__(self) -> LocalGateway:
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Stop ``proc``'s process group (a process started with ``start_new_session``): SIGTERM, then
    SIGKILL after ``grace_s`` seconds; nothing where it has already exited."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_until_200(proc: subprocess.Popen, url: str, name: str, timeout: float) -> None:
    """Poll ``url`` every 0.3 s until it answers 200.

    Raises:
        RuntimeError: ``proc`` (the server, named ``name`` in the message) exited, or ``timeout``
            seconds passed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{name} not ready in time")
