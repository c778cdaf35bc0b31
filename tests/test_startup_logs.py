"""The planner against public vLLM start-up logs (issue 12, ``tests/data/vllm_startup_logs.json``).

Each checked record is replayed with its own flags through ``predict_startup`` by
``scripts/startup_logs.py``: the KV-cache tokens vLLM logged within 10%, the weights within 3%, and
a start-up vLLM refused refused by the planner too. Records the planner does not follow (V0, MoE,
other architectures, models or GPUs the log does not name) stay in the file with the reason.
"""

from __future__ import annotations

import sys

import pytest

from tests.scripts import load_script

startup_logs = load_script("startup_logs")
DATA = startup_logs.load()
CHECKED = [(i, r) for i, r in enumerate(DATA["records"]) if r["checks"]]


def test_the_file_holds_enough_public_logs_each_with_its_source():
    records = DATA["records"]
    assert len(records) >= 15
    for record in records:
        assert record["url"].startswith("https://"), record
        assert record["vllm_version"] and "failed" in record["logged"]
        assert record["checks"] or record["unsupported"], record  # every record is checked or says why not
    assert sum("kv" in r["checks"] for r in records) >= 15
    for model in {r["model"] for _, r in CHECKED} & set(DATA["configs"]):
        assert DATA["configs"][model]["source"].startswith("https://huggingface.co/")


@pytest.mark.parametrize(("index", "record"), CHECKED, ids=[f"{i}-{r['model']}" for i, r in CHECKED])
def test_a_logged_start_up_is_predicted(tmp_path, index, record):
    replay = startup_logs.replay(record, DATA["configs"], tmp_path)
    if "weights" in record["checks"]:
        assert abs(replay.weights_error) <= 0.03, f"weights {replay.weights_error:+.1%}: {record['url']}"
    if "kv" in record["checks"]:
        assert abs(replay.kv_error) <= 0.10, f"KV tokens {replay.kv_error:+.1%}: {record['url']}"
        assert replay.startup.error is None, replay.startup.error
    if "failure" in record["checks"]:  # vLLM refused this start-up: so does the planner
        assert record["logged"]["failed"] and replay.startup.error, record["url"]


def test_the_script_prints_the_table_and_the_errors(capsys):
    sys.argv = ["startup_logs.py"]
    startup_logs.main()
    out = capsys.readouterr().out
    assert "| model | GPU | vLLM | flags |" in out
    assert "KV tokens: 16 logs, median error" in out and "weights: 23 logs" in out
    assert "Failed start-ups: 4 of 4 refused." in out
