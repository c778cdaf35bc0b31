"""Storage faults on a real gateway: a full data folder (507, nothing left behind), a job store that
takes no writes (SQLite on a full disk, Redis gone: /readyz and submissions 503, one log line each
way), and recovery by itself, every page accepted before the fault done exactly once.

The disks are small tmpfs mounts made for the test: that needs root (or CAP_SYS_ADMIN); where
mounting is not possible the tests skip, saying so. A read-only remount or ``chattr +i`` cannot
fault a database the gateway holds open (Linux refuses the remount while files are open for
writing, and an immutable flag does not stop writes through open descriptors), so the SQLite store
is made unwritable by filling its disk: SQLite then answers "database or disk is full".
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ocrserve.bench.harness import LocalGateway, free_port
from ocrserve.errors import PROBLEM_BASE
from tests import needs
from tests.conftest import TEST_OVERRIDES, wait_for
from tests.jobs_util import numbered_tiff, page_number, read_events, wait_job

PAGES = 12
#: How long the store stays broken in the store tests, seconds: many polls of every loop.
OUTAGE_S = 3.0


@contextlib.contextmanager
def tmpfs(path: Path, size_mb: int) -> Iterator[Path]:
    """A fresh tmpfs of ``size_mb`` MB mounted at ``path``, unmounted afterwards; skips the test where
    this process may not mount."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (euid 0); run as root to test full disks")
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode}); needs CAP_SYS_ADMIN")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path) -> Path:
    """Write a file in ``folder`` until its disk is full; returns it (delete it to free the space)."""
    filler = folder / "filler"
    chunk = b"\0" * (1 << 16)
    with filler.open("wb", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(chunk)
    return filler


def gateway(data_dir: Path, log: Path, *overrides: str) -> LocalGateway:
    """A gateway keeping its jobs in ``data_dir``, probing its storage twice a second, its output in
    ``log``. ``store.min_free_mb`` keeps its default, 64 MB, more than the test volumes hold: a full
    condition then ends once a quarter of the volume is free (it never ended, a fresh user found)."""
    with log.open("ab") as out:
        started = LocalGateway(
            *TEST_OVERRIDES,
            f"store.data_dir={data_dir}",
            "store.probe_interval_s=0.5",
            "jobs.poll_interval_s=0.1",
            "jobs.lease_s=2",
            "jobs.events_poll_s=0.1",
            *overrides,
            log=out,
        )
    return started.wait_ready()


def submit(client: httpx.Client, pages: int = PAGES) -> httpx.Response:
    return client.post("/v1/jobs", files={"file": ("pages.tif", numbered_tiff(pages))})


def accepted(client: httpx.Client) -> str:
    """Submit until a job is accepted (the gateway noticed the storage works again); its id."""
    response = wait_for(lambda: (r := submit(client, 2)).status_code == 202 and r, timeout=30)
    return response.json()["id"]


def assert_done_once(client: httpx.Client, data_dir: Path, job_id: str, pages: int) -> None:
    """The job succeeded with each page done once, and its folder holds one result file a page."""
    status = wait_job(client, job_id)
    assert (status["status"], status["pages_done"], status["pages_failed"]) == ("succeeded", pages, 0), status
    result = client.get(f"/v1/jobs/{job_id}/result").json()
    assert [page_number(p["text"]) for p in result["pages"]] == list(range(1, pages + 1))
    events = read_events(client, job_id)
    assert sorted(e[2]["page"] for e in events[:-1]) == list(range(pages))  # every page, none twice
    files = sorted(p.name for p in (data_dir / "jobs" / job_id).iterdir())
    results = [name for name in files if name.startswith("page-")]
    assert len(results) == pages and len({name.split("-")[1] for name in results}) == pages, files  # no orphans
    assert all(name.startswith(("page-", "upload-")) for name in files), files  # no temporary files


def staged(data_dir: Path) -> list[str]:
    """Uploads left in ``staging/`` (the storage probe's own one-byte file aside)."""
    return [p.name for p in (data_dir / "staging").iterdir() if not p.name.startswith(".probe-")]


def log_lines(log: Path, text: str) -> int:
    return sum(text in line for line in log.read_text(errors="replace").splitlines())


@pytest.mark.slow
def test_full_data_folder_refuses_jobs_with_507_and_recovers(tmp_path):
    log = tmp_path / "gateway.log"
    with tmpfs(tmp_path / "data", size_mb=24) as data_dir:
        gw = gateway(data_dir, log, f"store.url=sqlite:///{tmp_path}/db/jobs.db")
        try:
            with httpx.Client(base_url=gw.url, timeout=60) as client:
                first = submit(client).json()["id"]
                wait_job(client, first, until=lambda s: s["pages_done"] >= 1)
                filler = fill(data_dir)
                refused = submit(client)
                assert refused.status_code == 507, refused.text
                assert refused.headers["content-type"] == "application/problem+json"
                assert refused.json()["type"].endswith("/insufficient-storage")
                assert staged(data_dir) == []  # the partial upload went at once
                assert len(list((data_dir / "jobs").iterdir())) == 1  # nor a folder of the refused job
                assert client.get("/readyz").status_code == 200  # synchronous OCR needs no disk
                status = client.get(f"/v1/jobs/{first}").json()
                assert status["pages_failed"] == 0 and status["pages_done"] < PAGES  # waiting, not failed

                filler.unlink()
                second = accepted(client)
                assert_done_once(client, data_dir, first, PAGES)
                assert_done_once(client, data_dir, second, 2)
                assert staged(data_dir) == []
        finally:
            gw.stop()
    assert log_lines(log, "full: No space left on device") == 1
    assert log_lines(log, "has room again") == 1
    assert log_lines(log, "Traceback") == 0


def assert_store_outage(client: httpx.Client, data_dir: Path) -> None:
    """While the store fails: /readyz and submissions 503 with Retry-After, nothing staged."""
    wait_for(lambda: client.get("/readyz").status_code == 503, timeout=15)
    ready = client.get("/readyz")
    assert ready.json()["type"].endswith("/store-unavailable") and int(ready.headers["retry-after"]) >= 1
    jobs_before = len(list((data_dir / "jobs").iterdir()))
    refused = submit(client)
    assert refused.status_code == 503, refused.text
    assert refused.json()["type"].endswith("/store-unavailable") and int(refused.headers["retry-after"]) >= 1
    assert staged(data_dir) == [] and len(list((data_dir / "jobs").iterdir())) == jobs_before
    time.sleep(OUTAGE_S)  # every loop polls many times meanwhile


def assert_logged_once_each_way(log: Path) -> None:
    assert log_lines(log, "job store failing:") == 1
    assert log_lines(log, "job store recovered") == 1
    assert log_lines(log, "Traceback") == 0


@pytest.mark.slow
def test_sqlite_store_on_a_full_disk_fails_readiness_and_recovers(tmp_path):
    log, data_dir = tmp_path / "gateway.log", tmp_path / "data"
    with tmpfs(tmp_path / "db", size_mb=16) as db_dir:
        gw = gateway(data_dir, log, f"store.url=sqlite:///{db_dir}/jobs.db")
        try:
            with httpx.Client(base_url=gw.url, timeout=60) as client:
                first = submit(client).json()["id"]
                wait_job(client, first, until=lambda s: s["pages_done"] >= 2)
                filler = fill(db_dir)
                assert_store_outage(client, data_dir)
                assert client.get(f"/v1/jobs/{first}").json()["pages_done"] < PAGES

                filler.unlink()
                wait_for(lambda: client.get("/readyz").status_code == 200, timeout=15)
                second = accepted(client)
                assert_done_once(client, data_dir, first, PAGES)
                assert_done_once(client, data_dir, second, 2)
        finally:
            gw.stop()
    assert_logged_once_each_way(log)


class PersistentRedis:
    """``redis-server`` on a fixed loopback port with an append-only file, so that it can be stopped
    (unreachable) and started again with its data."""

    def __init__(self, folder: Path):
        self.executable = needs.program("redis-server")
        self.folder, self.port = folder, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        folder.mkdir(parents=True, exist_ok=True)
        self.start()

    def start(self) -> None:
        """Start the server and wait for it to answer."""
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder), "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always"]
        self.proc = subprocess.Popen([self.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, timeout=20)

    def _answers(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
        return False

    def stop(self) -> None:
        """Stop the server (it writes its append-only file first)."""
        self.proc.terminate()
        self.proc.wait(20)


@pytest.mark.redis
def test_unreachable_redis_fails_readiness_and_recovers(tmp_path):
    log, data_dir = tmp_path / "gateway.log", tmp_path / "data"
    redis = PersistentRedis(tmp_path / "redis")
    try:
        gw = gateway(data_dir, log, f"store.url={redis.url}")
        try:
            with httpx.Client(base_url=gw.url, timeout=60) as client:
                first = submit(client).json()["id"]
                wait_job(client, first, until=lambda s: s["pages_done"] >= 2)
                redis.stop()
                assert_store_outage(client, data_dir)
                status = client.get(f"/v1/jobs/{first}")  # a read of the store, too, is a 503 now
                assert (status.status_code, status.json()["type"]) == (503, PROBLEM_BASE + "store-unavailable")

                redis.start()
                wait_for(lambda: client.get("/readyz").status_code == 200, timeout=15)
                second = accepted(client)
                assert_done_once(client, data_dir, first, PAGES)
                assert_done_once(client, data_dir, second, 2)
        finally:
            gw.stop()
    finally:
        redis.stop()
    assert_logged_once_each_way(log)


@pytest.mark.redis
def test_the_ready_line_waits_for_a_store_unreachable_at_start(tmp_path):
    """Warm with its Redis store down, a gateway says so and logs that it is ready only once
    ``/readyz`` can answer 200."""
    log = tmp_path / "gateway.log"
    redis = PersistentRedis(tmp_path / "redis")
    redis.stop()
    with log.open("ab") as out:
        gw = LocalGateway(*TEST_OVERRIDES, f"store.url={redis.url}", "store.probe_interval_s=0.5", log=out)
    try:
        wait_for(lambda: log_lines(log, "engine warm; /readyz answers 503 until the job store recovers"), 120)
        assert httpx.get(gw.url + "/readyz", timeout=30).status_code == 503
        assert log_lines(log, " ready on ") == 0
        redis.start()
        wait_for(lambda: httpx.get(gw.url + "/readyz", timeout=30).status_code == 200, timeout=30)
        wait_for(lambda: log_lines(log, " ready on "), timeout=10)
        assert log_lines(log, " ready on ") == 1
    finally:
        gw.stop()
        redis.stop()
