"""``ocrserve launch --profile prod`` as a real process, with ``tests/fake_vllm.py`` as the ``vllm``
executable: the stand-in parses ``vllm serve MODEL --host H --port P ...`` and becomes
``ocrserve engine serve --backend onnx`` on that port, so the launcher's plan, health wait, log
relay and start-up failures run for real. Plus, where vLLM is importable, every vLLM
profile's launch command through vLLM's own argument parser.

vLLM killed and restarted, and SIGTERM draining the gateway and vLLM, are shown on the real vLLM
(``tests/test_real_launch.py``, tier ``real_vllm``)."""

from __future__ import annotations

import importlib.util
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from typer.testing import CliRunner

from ocrserve.bench.harness import REPO
from ocrserve.cli import app
from ocrserve.config import list_profiles, load_config
from ocrserve.gpu.launcher import plan_for, vllm_command
from tests.conftest import DATA
from tests.launches import LaunchedProcess
from tests.test_planner import _vllm_parser

FAKE_VLLM = Path(__file__).with_name("fake_vllm.py")
#: The GPU each vLLM profile is planned for when vLLM's parser checks it (profiles say gpu: auto).
PROFILE_GPUS = {"prod": "RTX 4090D", "gpu-24g": "RTX 4090", "gpu-12g": "RTX 3060"}


class Launch(LaunchedProcess):
    """``ocrserve launch --profile prod`` on loopback with the stand-in vLLM; output to a file.

    The stand-in is found through ``PATH`` (its ``#!/usr/bin/env python3`` must be this Python,
    which has ocrserve installed).
    """

    def __init__(self, log: Path, *overrides: str, env: dict | None = None):
        super().__init__(log)
        args = [sys.executable, "-m", "ocrserve", "launch", "--profile", "prod", "--port", str(self.port)]
        for item in (
            f"vllm.executable={FAKE_VLLM}",
            "vllm.gpu=RTX 4090D",
            f"vllm.port={self.vllm_port}",
            "preprocess.workers=1",
            "vllm.restart_backoff_s=0.5",
            "engine.vllm.poll_interval_s=0.3",
            *overrides,
        ):
            args += ["--set", item]
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        self.start(args, {**os.environ, "PATH": path, **(env or {})})

    def vllm_process(self) -> psutil.Process:
        """The running stand-in vLLM (the launcher's child serving the engine)."""
        for child in psutil.Process(self.proc.pid).children():
            if "engine" in child.cmdline() and "serve" in child.cmdline():
                return child
        raise AssertionError("no vLLM process under the launcher")


def ocr(url: str, name: str = "phototest.tif") -> httpx.Response:
    return httpx.post(url + "/v1/ocr", files={"file": (name, (DATA / name).read_bytes())}, timeout=120)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One prod launch for the module (its stand-in vLLM loads ONNX models for several seconds)."""
    launch = Launch(tmp_path_factory.mktemp("launch") / "launch.log")
    try:
        launch.wait_until(200)
        yield launch
    finally:
        launch.kill()


def test_dry_run_prints_the_plan_and_both_command_lines():
    result = CliRunner().invoke(
        app,
        [
            "launch",
            "--profile",
            "prod",
            "--dry-run",
            "--set",
            "vllm.gpu=RTX 4090D",
            "--set",
            "vllm.extra_args=[--enforce-eager]",
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "tencent/HunyuanOCR on 1 x RTX 4090D" in result.stdout and "--max-num-seqs" in result.stdout
    vllm_line = next(line for line in result.stdout.splitlines() if line.startswith("vLLM:"))
    assert vllm_line.split()[1:4] == ["vllm", "serve", "tencent/HunyuanOCR"]
    assert "--max-num-seqs 9" in vllm_line and "--port 8001" in vllm_line and vllm_line.endswith("--enforce-eager")
    gateway_line = next(line for line in result.stdout.splitlines() if line.startswith("gateway:"))
    assert "ocrserve launch --profile prod" in gateway_line
    assert "engine.vllm.base_urls=[http://127.0.0.1:8001]" in gateway_line
    assert "engine.vllm.slots_per_replica=9" in gateway_line


def test_dry_run_without_a_gpu_plans_for_a_named_default_and_says_so():
    """A dry run works anywhere: on a machine without a GPU (this one, CI) it plans for the
    ``DRY_RUN_GPU`` and says so; the table no longer repeats the vLLM command line."""
    result = CliRunner().invoke(app, ["launch", "--profile", "prod", "--dry-run"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "no NVIDIA GPU found here; this dry run plans for the H100 80G" in result.output
    assert "tencent/HunyuanOCR on 1 x H100 80G" in result.stdout
    assert sum("vllm serve tencent/HunyuanOCR" in line for line in result.stdout.splitlines()) == 1


def test_unknown_gpu_is_an_error_that_says_how_to_name_one():
    result = CliRunner().invoke(app, ["launch", "--profile", "prod", "--dry-run", "--set", "vllm.gpu=Voodoo 5"])
    assert result.exit_code == 2
    assert "unknown GPU 'Voodoo 5'" in result.output and "--set vllm.gpu=NAME" in result.output


def test_serve_vllm_script_runs_the_command_the_launcher_plans():
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(
        [str(REPO / "scripts" / "serve-vllm.sh"), "--gpu", "RTX 4090D"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": path, "DRY_RUN": "1"},
    )
    assert done.returncode == 0, done.stderr
    config = load_config("prod", ["vllm.gpu=RTX 4090D"], environ={})
    assert shlex.split(done.stderr.strip().splitlines()[-1]) == vllm_command(config, plan_for(config))


def test_vllm_exiting_before_healthy_fails_fast_with_its_last_lines(tmp_path):
    launch = Launch(tmp_path / "launch.log", env={"FAKE_VLLM_FAIL": "RuntimeError: CUDA out of memory (stand-in)"})
    try:
        assert launch.proc.wait(30) == 1
    finally:
        launch.kill()
    output = launch.output()
    assert "vLLM exited with code 1 before it was healthy" in output
    assert "vllm | RuntimeError: CUDA out of memory (stand-in)" in output.split("before it was healthy")[1]
    assert "gateway listening" not in output


@pytest.mark.slow
def test_gateway_starts_after_vllm_is_healthy_and_reads_through_it(launched):
    output = launched.output()
    order = [
        f"waiting for {launched.vllm_url}/health",
        "vllm | fake vllm: serve tencent/HunyuanOCR",
        "vLLM is healthy; starting the gateway",
        f"gateway listening on {launched.url}",
    ]
    positions = [output.index(marker) for marker in order]
    assert positions == sorted(positions), output
    assert f"vLLM:    {FAKE_VLLM} serve tencent/HunyuanOCR" in output
    assert "vllm | INFO:" in output  # the engine's own log, relayed with the prefix
    (entry,) = httpx.get(launched.url + "/v1/models").json()["data"]
    assert entry["slots"] == 9 and entry["replicas"][0]["url"] == launched.vllm_url
    response = ocr(launched.url)
    assert response.status_code == 200
    assert response.json()["text"].startswith("This is a lot of 12 point text")


@pytest.mark.vllm
def test_every_vllm_profile_launches_with_an_argv_vllm_accepts():
    parser, validate = _vllm_parser()
    profiles = [name for name in list_profiles() if load_config(name, environ={}).engine.kind == "vllm"]
    assert {"prod", "gpu-24g", "gpu-12g"} <= set(profiles)
    for name in profiles:
        config = load_config(name, [f"vllm.gpu={PROFILE_GPUS.get(name, 'H100')}"], environ={})
        plan = plan_for(config)
        argv = vllm_command(config, plan)
        assert argv[:3] == ["vllm", "serve", config.engine.model], name
        args = parser.parse_args(argv[2:])
        validate(args)
        assert (args.host, args.port) == (config.vllm.host, config.vllm.port)
        assert args.max_num_seqs == plan.vllm_args["max_num_seqs"] >= 1
        assert args.mm_processor_kwargs == {
            "min_pixels": config.preprocess.min_pixels,
            "max_pixels": config.preprocess.max_pixels,
        }


@pytest.mark.parametrize("profile", ["local", "prod"])
def test_taken_address_fails_before_models_or_vllm_start(profile):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [
            sys.executable,
            "-m",
            "ocrserve",
            "launch",
            "--profile",
            profile,
            "--port",
            str(port),
            "--set",
            f"vllm.executable={FAKE_VLLM}",
            "--set",
            "vllm.gpu=RTX 4090D",
        ]
        done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "started vLLM" not in done.stdout + done.stderr and "Waiting for application startup" not in done.stderr


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("engine.model=/no/such/model", "engine.model: no such model folder: '/no/such/model'"),
        ("engine.transformers.device=tpu", "engine.transformers.device='tpu': Expected one of cpu, cuda"),
        ("engine.transformers.max_new_tokens=0", "greater than or equal to 1, or 'auto' (got 0)"),
        ("engine.transformers.attn_implementation=flash_attention_2", "the flash_attn package is not installed"),
    ],
)
def test_a_bad_debug_engine_setting_fails_before_the_server_starts(tmp_path, setting, message):
    pytest.importorskip(
        "transformers", minversion="5.13", reason="the debug engine needs transformers: pip install -e '.[debug]'"
    )
    if "flash_attention_2" in setting and importlib.util.find_spec("flash_attn"):
        pytest.skip("flash-attn is installed here")
    from tests.tiny_hunyuan import build_tiny_hunyuan

    model = f"engine.model={build_tiny_hunyuan(tmp_path)}"
    result = CliRunner().invoke(app, ["launch", "--profile", "debug", "--set", model, "--set", setting])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.output and "gateway:" not in result.stdout


def test_a_model_folder_without_weights_fails_before_the_server_starts(tmp_path):
    pytest.importorskip(
        "transformers", minversion="5.13", reason="the debug engine needs transformers: pip install -e '.[debug]'"
    )
    from tests.tiny_hunyuan import build_tiny_hunyuan

    folder = build_tiny_hunyuan(tmp_path / "model")
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    result = CliRunner().invoke(app, ["launch", "--profile", "debug", "--set", f"engine.model={folder}"])
    assert result.exit_code == 2, result.output
    assert "the folder holds no weights (*.safetensors, pytorch_model*.bin)" in " ".join(result.stderr.split())
