"""``ocrserve launch --profile cpu-vllm`` starting, supervising and stopping a real ``vllm serve``
(vLLM's CPU build, :mod:`tests.real_vllm`) on the tiny random-weight HunyuanOCR: ONE launch for the
module (vLLM takes 30-120 s to become healthy on 2 busy cores, and the restart test starts it a
second time). vLLM's own log, relayed by the launcher with its ``vllm | `` prefix and
``--enable-log-requests``, is the evidence of what reached it.

``tests/test_launcher.py`` keeps the stand-in vLLM (``tests/fake_vllm.py``) for the launcher's
plumbing on machines without vLLM's CPU build and for a vLLM that dies before it is healthy.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import DATA, wait_for
from tests.jobs_util import numbered_tiff, wait_job
from tests.launches import LaunchedProcess
from tests.real_vllm import MAX_NEW_TOKENS, require_vllm_env
from tests.test_real_vllm import slow_page

pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(600)]  # vLLM starts in 30-240 s here

#: Output-token cap of the calibration pages (``router.calibrate_max_tokens``): below the
#: ``--override-generation-config`` cap, so vLLM's log tells calibration requests apart.
CALIBRATION_TOKENS = 8
#: Pages of the job that is in flight when vLLM is killed.
JOB_PAGES = 12


class RealLaunch(LaunchedProcess):
    """``ocrserve launch --profile cpu-vllm`` with the tiny model and a small plan; output to ``log``."""

    READY_TIMEOUT_S = 300.0  # vLLM starts in 30-240 s on 2 busy cores

    def __init__(self, env: Path, model: Path, log: Path, store: Path):
        super().__init__(log)
        extra = [
            "--enable-log-requests",
            "--override-generation-config",
            json.dumps({"max_new_tokens": MAX_NEW_TOKENS}),
        ]
        args = [sys.executable, "-m", "ocrserve", "launch", "--profile", "cpu-vllm", "--port", str(self.port)]
        for item in (
            f"engine.model={model}",
            f"vllm.executable={env / 'bin' / 'vllm'}",
            f"vllm.port={self.vllm_port}",
            "vllm.kv_cache_memory_bytes=134217728",  # 128 MiB: 6 pages of the planned 19,123 tokens
            "vllm.max_num_seqs=4",
            "vllm.cpu_threads_bind=0",  # one core for vLLM's engine, the other for the rest
            f"vllm.extra_args={json.dumps(extra)}",
            "vllm.restart_backoff_s=0.5",
            f"router.calibrate_max_tokens={CALIBRATION_TOKENS}",
            "engine.vllm.poll_interval_s=0.3",
            "preprocess.workers=1",
            f"store.data_dir={store}",
            "jobs.retry_backoff_s=0.5",
        ):
            args += ["--set", item]
        environ = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
        environ.pop("PYTHONPATH", None)  # vLLM's venv has ocrserve (its plugin) of its own; -m finds REPO's
        environ.pop("VIRTUAL_ENV", None)
        self.start(args, environ)

    def vllm_lines(self, pattern: str) -> list[str]:
        return [line for line in self.output().splitlines() if line.startswith("vllm | ") and re.search(pattern, line)]

    def vllm_process(self) -> psutil.Process:
        """vLLM's API server: the launcher's child running ``vllm serve``."""
        for child in psutil.Process(self.proc.pid).children():
            if "serve" in child.cmdline():
                return child
        raise AssertionError("no vLLM process under the launcher")


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    env = require_vllm_env()
    pytest.importorskip(
        "transformers", reason="building the tiny model needs the debug extra: pip install -e '.[debug]'"
    )
    from tests.tiny_hunyuan import build_tiny_hunyuan

    folder = tmp_path_factory.mktemp("real-launch")
    model = build_tiny_hunyuan(folder / "model", head_dim=32)
    launch = RealLaunch(env, model, folder / "launch.log", folder / "store")
    try:
        launch.ready_after_s = launch.wait_until(200)
        yield launch
    finally:
        launch.kill()


def ocr(url: str, timeout: float = 120) -> httpx.Response:
    """A page with ``timeout`` as its own deadline too: on one busy core it may queue far longer
    than the fast lane's latency target, and is meant to wait."""
    page = {"file": ("phototest.tif", (DATA / "phototest.tif").read_bytes())}
    return httpx.post(url + "/v1/ocr", files=page, data={"timeout": str(timeout)}, timeout=timeout + 10)


def test_launch_plans_starts_vllm_calibrates_briefly_and_serves_a_page(launched):
    """The launcher plans and starts the real vLLM, waits for its /health, starts the gateway;
    the gateway's three calibration pages reach vLLM capped at ``router.calibrate_max_tokens`` and
    are not retried (a random model never ends its reply: uncapped, each ran to the model card's
    16,384 tokens, twice), so /readyz turns 200 soon after vLLM is healthy; then a page goes
    through."""
    output = launched.output()
    assert "--max-num-queued-reqs" in output and "--enable-log-requests" in output  # the planned argv
    calibration = launched.vllm_lines(rf"Received request .*max_tokens={CALIBRATION_TOKENS},")
    assert len(calibration) == 3, calibration  # one each, never retried
    assert "calibration skipped" not in output
    healthy = output.index("vLLM is healthy; starting the gateway")
    assert healthy < output.index("ready on http://")
    response = ocr(launched.url)
    assert response.status_code == 200, response.text
    (page,) = response.json()["pages"]
    assert page["generation"] == {
        "finish_reason": "length",
        "truncated": True,
        "retried": True,
        "completion_tokens": MAX_NEW_TOKENS,
    }
    assert launched.vllm_lines(rf"Received request .*max_tokens={MAX_NEW_TOKENS},")
    print(
        f"/readyz 200 after {launched.ready_after_s:.0f} s; calibration in vLLM's log: {len(calibration)} requests "
        f"with max_tokens={CALIBRATION_TOKENS}"
    )


def test_vllm_killed_mid_flood_is_restarted_jobs_finish_and_sync_requests_fail_clearly(launched):
    """SIGKILL of vLLM's process group while a job and synchronous requests are in flight: the
    launcher restarts vLLM; every synchronous request ends (200 before the kill, else 503/504 with
    ``Retry-After``), none hangs; the job's pages that failed are retried and the job succeeds."""
    http = httpx.Client(base_url=launched.url, timeout=120)
    added = len(launched.vllm_lines("Added request"))
    job = http.post("/v1/jobs", files={"file": ("pages.tif", numbered_tiff(JOB_PAGES))})
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    answers: list[httpx.Response | Exception] = []

    def sync() -> None:
        try:
            answers.append(ocr(launched.url, timeout=180))
        except Exception as exc:  # noqa: BLE001 - a hang or a dropped connection is the failure we look for
            answers.append(exc)

    senders = [threading.Thread(target=sync) for _ in range(4)]
    for sender in senders:
        sender.start()
    # in vLLM's engine now (its log, not its /metrics: on 2 busy cores its API server answers
    # between steps, and a poll could miss every running page)
    wait_for(lambda: len(launched.vllm_lines("Added request")) > added)
    first = launched.vllm_process()
    group = [first, *first.children(recursive=True)]
    os.killpg(first.pid, signal.SIGKILL)  # the OOM killer's way: no goodbye
    killed = time.monotonic()
    for sender in senders:
        sender.join(180)
    assert not any(sender.is_alive() for sender in senders), "a synchronous request hangs"
    statuses = [a.status_code if isinstance(a, httpx.Response) else repr(a) for a in answers]
    assert all(s in (200, 503, 504) for s in statuses), statuses
    for answer in answers:
        if answer.status_code != 200:
            assert int(answer.headers["retry-after"]) >= 1, answer.headers
    gone, alive = psutil.wait_procs(group, timeout=15)
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
    back = launched.wait_until(200)
    assert launched.vllm_process().pid != first.pid
    assert "vLLM exited with code -9; restarting it in 0.5 s" in launched.output()
    done = wait_job(http, job_id, timeout=300)
    assert done["status"] == "succeeded", done
    print(
        f"sync answers {statuses}; vLLM healthy again {back:.0f} s after the kill check "
        f"({time.monotonic() - killed:.0f} s after the kill); job {done['status']}"
    )


def test_sigterm_drains_the_gateway_and_vllm_and_leaves_no_process(launched):
    """SIGTERM to the launcher while a page is in vLLM (a 2048 x 2048 page: seconds of prefill):
    the gateway drains it (200), then vLLM's process group stops; no process is left."""
    family = psutil.Process(launched.proc.pid).children(recursive=True)
    assert any("serve" in p.cmdline() for p in family)
    answer: list[httpx.Response] = []
    added = len(launched.vllm_lines("Added request"))
    files = {"file": ("slow.png", slow_page())}
    request = threading.Thread(
        target=lambda: answer.append(httpx.post(launched.url + "/v1/ocr", files=files, timeout=120))
    )
    request.start()
    wait_for(lambda: len(launched.vllm_lines("Added request")) > added)  # in vLLM's engine now
    started = time.monotonic()
    launched.proc.send_signal(signal.SIGTERM)
    request.join(120)
    assert answer and answer[0].status_code == 200, answer and answer[0].text  # drained, not dropped
    assert launched.proc.wait(60) == 0
    gone, alive = psutil.wait_procs(family, timeout=15)
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
    assert "stopping vLLM" in launched.output()
    assert not launched.vllm_lines("Aborted request")  # nothing cut short by the stop
    print(f"launcher and {len(family)} processes gone {time.monotonic() - started:.1f} s after SIGTERM")
