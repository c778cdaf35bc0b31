"""An ``ocrserve launch`` child process in the tests: its output, its ``/readyz``, its clean-up.

``tests/test_launcher.py`` (the stand-in vLLM) and ``tests/test_real_launch.py`` (vLLM's CPU build)
subclass :class:`LaunchedProcess` with the launch they start and how they find its vLLM.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import httpx
import psutil

from ocrserve.bench.harness import REPO, free_port


class LaunchedProcess:
    """``args`` (an ``ocrserve launch`` command line) run from the repository root, its output to
    ``log``; ``url`` is the gateway's, ``vllm_url`` vLLM's (ports picked here: :attr:`port`,
    :attr:`vllm_port`, for the subclass to put in ``args`` before :meth:`start`)."""

    #: Seconds :meth:`wait_until` waits by default.
    READY_TIMEOUT_S = 120.0

    def __init__(self, log: Path):
        self.port, self.vllm_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.vllm_url = f"http://127.0.0.1:{self.vllm_port}"
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self, args: list[str], env: dict[str, str]) -> None:
        """Start ``args`` with environment ``env``, output to the log."""
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def ready(self) -> int:
        """``/readyz``'s status, 0 while nothing answers."""
        try:
            return httpx.get(self.url + "/readyz", timeout=2).status_code
        except httpx.TransportError:
            return 0

    def wait_until(self, status: int, timeout: float | None = None) -> float:
        """Poll ``/readyz`` until it answers ``status``; the seconds it took. Fails with the end of
        the launcher's output when it exits or ``timeout`` (:data:`READY_TIMEOUT_S`) passes."""
        started, limit = time.monotonic(), timeout or self.READY_TIMEOUT_S
        while time.monotonic() - started < limit:
            assert self.proc.poll() is None, f"launcher exited with {self.proc.returncode}:\n{self.output()[-8000:]}"
            if self.ready() == status:
                return time.monotonic() - started
            time.sleep(0.1)
        raise AssertionError(f"/readyz never answered {status}:\n{self.output()[-8000:]}")

    def kill(self) -> None:
        """Last-resort clean-up: SIGKILL the launcher and everything under it."""
        if self.proc.poll() is None:
            family = psutil.Process(self.proc.pid).children(recursive=True)
            for process in [psutil.Process(self.proc.pid), *family]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            self.proc.wait()
