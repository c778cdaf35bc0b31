"""A real ``redis-server`` on a free loopback port with a temporary folder, for the job-store tests.

Debian's ``redis-server`` package provides it (``.ci/run`` installs it); where it is missing the
tests that need it skip, saying so.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time

import pytest

from ocrserve.bench.harness import free_port
from tests import needs


class RedisServer:
    """``redis-server`` without persistence, bound to 127.0.0.1 on a free port."""

    def __init__(self):
        executable = needs.program("redis-server")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="ocrserve-redis-")
        self.proc = subprocess.Popen(
            [
                executable,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self._dir.name,
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait()

    def _wait(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING in time")

    def stop(self) -> None:
        """Terminate the server and remove its folder."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._dir.cleanup()


@pytest.fixture(scope="module")
def redis_url():
    """The URL of a redis-server started for this test module."""
    server = RedisServer()
    yield server.url
    server.stop()
