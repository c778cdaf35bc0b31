"""The wheel: built from this checkout, installed into a fresh venv outside it, serving real OCR.

Proves what an editable install cannot: the package data (profiles, registry entries, Lua scripts)
is in the wheel and found through ``importlib.resources``, the ``ocrserve`` console script works,
and nothing needs the checkout or its working directory. The new venv gets the current venv's
dependencies without a download (:func:`tests.venvs.share_dependencies`).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import venv
from pathlib import Path

import httpx
import pytest

from ocrserve.bench.harness import LocalGateway, free_port
from tests.conftest import DATA, ground_truth
from tests.venvs import clean_env, require_setuptools, share_dependencies

ROOT = Path(__file__).resolve().parents[1]
#: Words of phototest.tif's ground truth the CPU engine must read.
WORDS = ("lot", "point", "text", "test", "ocr", "quick", "brown", "fox", "jumped", "lazy", "dog")

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _run(*args: str | Path, **kwargs) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A venv outside the checkout with the checkout's wheel installed (``--no-deps``) and the
    current venv's site-packages visible for the dependencies."""
    require_setuptools()
    base = tmp_path_factory.mktemp("wheel")
    # Build from a copy: setuptools writes build/ (and egg-info) into the tree it builds.
    source = base / "src"
    top_ignore = {"build", "dist", "venv", "out", "data", "tests", "examples", "shared"}
    shutil.copytree(
        ROOT,
        source,
        ignore=lambda folder, names: [
            n
            for n in names
            if n == "__pycache__"
            or n.endswith(".egg-info")
            or (Path(folder) == ROOT and (n.startswith(".") or n in top_ignore))
        ],
    )
    wheels = base / "wheels"
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--disable-pip-version-check",
        "-q",
        "-w",
        wheels,
        source,
    )
    (wheel,) = wheels.glob("ocrserve-*.whl")

    env_dir = base / "venv"
    venv.create(env_dir, with_pip=False, symlinks=True)
    python = env_dir / "bin" / "python"
    # Install before the dependencies are visible, so pip sees no ocrserve already installed.
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-deps",
        "--no-index",
        "--disable-pip-version-check",
        "-q",
        wheel,
    )
    share_dependencies(env_dir)
    return env_dir


def test_wheel_carries_the_package_data(wheel_venv, tmp_path):
    env = clean_env(wheel_venv, tmp_path / "data")
    where = _run(
        wheel_venv / "bin" / "python",
        "-c",
        "import ocrserve, ocrserve.config as c; print(ocrserve.__file__); print(c.profile_path('local'))",
        cwd=tmp_path,
        env=env,
    ).split()
    for path in where:  # the wheel's copy, not the checkout's (editable) one
        assert Path(path).resolve().is_relative_to(wheel_venv.resolve()), where
    listed = _run(wheel_venv / "bin" / "ocrserve", "profiles", cwd=tmp_path, env={**env, "COLUMNS": "200"})
    assert "local" in listed and "prod" in listed and "onnx" in listed


class WheelGateway(LocalGateway):
    """``<venv>/bin/ocrserve launch`` from ``cwd``; :meth:`wait_ready` and :meth:`stop`
    (SIGTERM to its process group, then wait) come from the harness."""

    def __init__(self, venv_dir: Path, cwd: Path, env: dict[str, str], log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        args = [str(venv_dir / "bin" / "ocrserve"), "launch", "--port", str(self.port), "--set", "preprocess.workers=1"]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                args, cwd=cwd, start_new_session=True, stdout=out, stderr=subprocess.STDOUT, env=env
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


def test_wheel_launch_serves_ocr_from_any_directory(wheel_venv, tmp_path):
    gateway = WheelGateway(wheel_venv, tmp_path, clean_env(wheel_venv, tmp_path / "data"), tmp_path / "launch.log")
    try:
        try:
            gateway.wait_ready(timeout=120)
        except RuntimeError as exc:
            pytest.fail(f"{exc}:\n{gateway.output()}")
        name = "phototest.tif"
        response = httpx.post(gateway.url + "/v1/ocr", files={"file": (name, (DATA / name).read_bytes())}, timeout=120)
        assert response.status_code == 200, response.text
        text = response.json()["text"].lower()
        # the web page and its files are in the wheel too (ocrserve.api.web)
        for path in ("/", "/static/app.js", "/static/app.css", "/docs"):
            assert httpx.get(gateway.url + path, timeout=30).status_code == 200, path
    finally:
        gateway.stop()
    truth = ground_truth("phototest.tif").lower()
    missing = [word for word in WORDS if word in truth and word not in text]
    assert not missing, f"missing {missing} in {text!r}"
    # uvicorn drains, then re-raises the SIGTERM it caught: -15 is its clean exit, -9 would be stop()'s SIGKILL
    assert gateway.proc.returncode in (0, -signal.SIGTERM), gateway.output()
    assert "Application shutdown complete" in gateway.output()
    assert "Traceback" not in gateway.output(), gateway.output()
