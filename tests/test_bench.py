"""``ocrserve bench`` end to end against the session gateway, ``ocrserve capacity``, and the
overlay a server-side sweep writes as ``launch --set-file`` reads it."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from ocrserve.bench.report import overlay_yaml
from ocrserve.cli import app
from tests.conftest import DATA

pytest.importorskip("matplotlib", reason="the bench report's plot needs matplotlib: pip install -e '.[test]'")


@pytest.mark.slow
def test_a_short_bench_run_reports_the_knee_quality_and_the_simulated_p95(gateway, tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "phototest.tif").write_bytes((DATA / "phototest.tif").read_bytes())
    (tmp_path / "docs" / "phototest.gt.txt").write_text((DATA / "phototest.gt.txt").read_text())
    command = [sys.executable, "-m", "ocrserve", "bench", "--url", gateway.url, "--corpus", str(tmp_path / "docs")]
    command += ["--concurrency", "1,2", "--rate", "1", "--duration", "3", "--p95", "60", "--out", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    closed = [p for p in report["points"] if p["mode"] == "closed"]
    assert [p["value"] for p in closed] == [1, 2] and all(p["pages_per_s"] > 0 for p in closed)
    assert all(p["statuses"] == {"200": p["requests"]} for p in report["points"])
    assert report["knee"]["value"] in (1, 2)
    assert report["recommendation"]["value"] in (1, 2)  # both meet a 60 s target: the faster one
    assert report["quality"]["drift_cer"] == 0.0  # the same page reads the same at either concurrency
    assert report["quality"]["scored_documents"] == 1 and report["quality"]["candidate_cer_vs_truth"] < 0.1
    (row,) = report["open_loop"]
    assert row["rate"] == 1 and row["offered_pages_per_s"] > 0 and row["measured_p95_s"] > 0
    assert row["simulated_p95_s"] > 0 and row["replayed_p95_s"] > 0
    assert report["service_model"]["documents"] == {"phototest.tif": [pytest.approx(1.0)]}  # the only page: the mean
    assert report["cost"]["pages_per_hour"] > 0
    rows = list(csv.DictReader((tmp_path / "out" / "report.csv").open()))
    assert len(rows) == 3 and rows[0]["mode"] == "closed"
    assert (tmp_path / "out" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "knee: concurrency = " in done.stdout and "open loop 1 pages/s (" in done.stdout
    planned = CliRunner().invoke(
        app, ["capacity", "--rate", "0.2", "--p95", "60", "--from-bench", str(tmp_path / "out" / "report.json")]
    )
    assert planned.exit_code == 0 and "replicas: 1 " in planned.output, planned.output


def test_capacity_plans_replicas_and_predicts_p95(tmp_path):
    # T(B) = 0.2 + 0.1 B, 4 at once: 6.67 pages/s a replica; 10 pages/s at 0.7 -> ceil(2.14) = 3
    result = CliRunner().invoke(
        app,
        ["capacity", "--rate", "10", "--p95", "5", "--a", "0.2", "--b", "0.1", "--max-batch", "4"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "replicas: 3 (ceil(10 / (6.667 x 0.7)) = 3" in result.output
    assert "each replica: 3.333 pages/s" in result.output
    missing = CliRunner().invoke(app, ["capacity", "--rate", "1", "--p95", "1"])
    assert missing.exit_code == 2 and "--from-bench" in missing.output


def test_a_recommended_overlay_is_applied_by_launch_set_file(tmp_path):
    overlay = tmp_path / "recommended.yaml"
    overlay.write_text(yaml.safe_dump(overlay_yaml({"engine.onnx.rec_batch_num": 16})))
    assert yaml.safe_load(overlay.read_text()) == {"engine": {"onnx": {"rec_batch_num": 16}}}
    result = CliRunner().invoke(app, ["launch", "--dry-run", "--set-file", str(overlay)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "--set engine.onnx.rec_batch_num=16" in result.output


@pytest.mark.slow
def test_the_mixed_scenario_reports_both_ratios(gateway, tmp_path):
    """``--scenario mixed`` against a gateway: the stream alone, the flood alone, then both."""
    (tmp_path / "docs").mkdir()
    for sample in ("phototest.tif", "testTIFF_multipage.tif"):
        (tmp_path / "docs" / sample).write_bytes((DATA / sample).read_bytes())
    command = [sys.executable, "-m", "ocrserve", "bench", "--url", gateway.url, "--corpus", str(tmp_path / "docs")]
    # 4 s: at 2 s a busy machine finished one interactive page alone
    command += ["--scenario", "mixed", "--concurrency", "1", "--duration", "4", "--interval", "0.5"]
    command += ["--out", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = json.loads((tmp_path / "out" / "mixed.json").read_text())["runs"]
    assert run["interactive_idle_n"] >= 2 and run["interactive_loaded_n"] >= 2 and run["errors"] == 0
    assert run["p95_ratio"] > 0 and run["bulk_ratio"] > 0 and run["bulk_alone_pages_per_s"] > 0
