"""The planner follows the target vLLM release (issue 12): its accounting, its defaults, its flags.

Version boundaries are the ones read from vLLM's wheels (``ocrserve/gpu/vllm_versions.py``); the
plans are the planner's own arithmetic, checked against each other (one term changed at a time).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ocrserve.cli import app
from ocrserve.gpu.defaults import compare_defaults
from ocrserve.gpu.memory import CUDA_GRAPH_RESERVE, NCCL_RESERVE, predict_startup
from ocrserve.gpu.planner import PlanError, plan_serving
from ocrserve.gpu.registry import GpuSpec, lookup
from ocrserve.gpu.vllm_versions import accounting_for, parse_version
from ocrserve.models import get_model
from tests.test_checkpoint import LLAMA_31_8B

HUNYUAN = get_model("tencent/HunyuanOCR")


@pytest.mark.parametrize(
    ("text", "version"),
    [("0.10.1.1", (0, 10, 1)), ("0.15.2rc1.dev93+g11a4c9d30", (0, 15, 2)), ("v0.33.0", (0, 33, 0)), ("1.0", (1, 0, 0))],
)
def test_versions_read_as_vllm_prints_them(text, version):
    assert parse_version(text) == version


@pytest.mark.parametrize(("text", "message"), [("0.9.0", "older than 0.9.1"), ("latest", "is not X.Y.Z")])
def test_versions_the_planner_does_not_follow_are_refused(text, message):
    with pytest.raises(PlanError, match=message):
        plan_serving(HUNYUAN, lookup("L4"), vllm_version=text)


def test_a_release_older_than_the_model_needs_is_refused_and_a_newer_one_is_flagged():
    with pytest.raises(PlanError, match=r"tencent/HunyuanOCR needs vLLM >= 0.18.1 .*; planning for 0.10.2"):
        plan_serving(HUNYUAN, lookup("L4"), vllm_version="0.10.2")
    newer = plan_serving(HUNYUAN, lookup("L4"), vllm_version="0.40.0")
    assert newer.vllm_version == "0.40.0"
    assert any("newer than 0.33.0, the newest release the planner has read" in w for w in newer.warnings)


def test_dtype_overrides_are_what_vllm_loads():
    with pytest.raises(PlanError, match="T4 16G has no bfloat16"):
        plan_serving(HUNYUAN, lookup("T4"), overrides={"dtype": "bfloat16"})
    fp32 = plan_serving(HUNYUAN, lookup("L4"), overrides={"dtype": "float32"})
    assert fp32.value("weights_bytes") == 2 * plan_serving(HUNYUAN, lookup("L4")).value("weights_bytes")
    assert fp32.value("kv_bytes_per_token") == 2 * 98_304 and "--dtype" in fp32.argv()


def test_each_release_charges_what_its_code_charges():
    boundaries = {
        "0.10.2": (True, False, False),  # NCCL after the snapshot; graphs after the KV cache; no queue bound
        "0.11.0": (False, False, False),
        "0.19.1": (False, False, False),  # the graph estimate exists but its switch defaults to 0
        "0.20.0": (False, True, False),
        "0.28.0": (False, True, False),
        "0.29.0": (False, True, True),
    }
    for version, expected in boundaries.items():
        rules = accounting_for(version)
        assert (rules.charges_nccl, rules.charges_cuda_graphs, rules.queue_limits) == expected, version


def test_vllm_defaults_by_gpu_and_release():
    big = GpuSpec("B200", 180 * 1024, (10, 0), 8000.0)
    assert accounting_for("0.33.0").default_batch(lookup("A100 80G")) == (256, 2048)  # "a100" is excluded
    assert accounting_for("0.33.0").default_batch(lookup("H100 80G")) == (1024, 8192)
    assert accounting_for("0.33.0").default_batch(lookup("L40S")) == (256, 2048)
    assert accounting_for("0.27.0").default_batch(big) == (1024, 8192)
    assert accounting_for("0.28.0").default_batch(big) == (1024, 16384)


def test_graphs_are_charged_only_by_releases_that_estimate_them_before_the_kv_cache():
    old = plan_serving(HUNYUAN, lookup("L4"), vllm_version="0.19.1")
    new = plan_serving(HUNYUAN, lookup("L4"), vllm_version="0.20.0")
    eager = plan_serving(HUNYUAN, lookup("L4"), vllm_version="0.20.0", overrides={"enforce_eager": True})
    assert new.value("reserve_bytes") - old.value("reserve_bytes") == CUDA_GRAPH_RESERVE
    assert eager.value("reserve_bytes") == old.value("reserve_bytes")
    # before 0.20 the graph pool sits outside gpu_memory_utilization, with the CUDA context
    assert old.value("cuda_context_bytes") - new.value("cuda_context_bytes") == CUDA_GRAPH_RESERVE
    assert "--enforce-eager" in eager.argv() and "--enforce-eager" not in new.argv()


def test_nccl_is_charged_at_tensor_parallel_before_0_11():
    model = get_model("Qwen/Qwen2.5-VL-7B-Instruct")  # served since vLLM 0.7.2
    before = plan_serving(model, lookup("RTX 3060"), gpus=4, vllm_version="0.10.2")
    after = plan_serving(model, lookup("RTX 3060"), gpus=4, vllm_version="0.11.0")
    assert before.strategy == after.strategy == "tensor"
    assert before.value("reserve_bytes") - after.value("reserve_bytes") == NCCL_RESERVE


def test_a_utilization_that_leaves_no_room_for_the_cuda_context_is_refused():
    with pytest.raises(PlanError, match=r"leaves 0.24 GiB .* below the 0.50 GiB .*; at most 0.97"):
        plan_serving(HUNYUAN, lookup("RTX 4090"), gpu_memory_utilization=0.99)
    with pytest.raises(PlanError, match="the CUDA context and CUDA graphs need"):  # before 0.20: graphs there too
        plan_serving(HUNYUAN, lookup("RTX 4090"), gpu_memory_utilization=0.97, vllm_version="0.19.1")
    assert plan_serving(HUNYUAN, lookup("RTX 4090"), gpu_memory_utilization=0.97).value("max_num_seqs") >= 1


def test_fp8_kv_cache_halves_the_bytes_per_token():
    auto = plan_serving(HUNYUAN, lookup("L4"))
    fp8 = plan_serving(HUNYUAN, lookup("L4"), overrides={"kv_cache_dtype": "fp8"})
    assert fp8.value("kv_bytes_per_token") * 2 == auto.value("kv_bytes_per_token") == 98_304
    assert fp8.value("max_num_seqs") > auto.value("max_num_seqs")
    with pytest.raises(PlanError, match="kv_cache_dtype='int4'"):
        plan_serving(HUNYUAN, lookup("L4"), overrides={"kv_cache_dtype": "int4"})


def test_vllms_own_queue_is_bounded_where_the_release_can():
    plan = plan_serving(HUNYUAN, lookup("L4"), vllm_version="0.29.0", gateway_overcommit=1.5, gateway_burst=1)
    seqs = plan.value("max_num_seqs")
    assert plan.vllm_args["max_num_queued_reqs"] == -(-seqs * 3 // 2) + 1
    per_page = plan.value("visual_tokens") + plan.value("prompt_tokens")
    assert plan.vllm_args["max_num_queued_tokens"] == plan.vllm_args["max_num_queued_reqs"] * per_page
    older = plan_serving(HUNYUAN, lookup("L4"), vllm_version="0.28.0")
    assert "max_num_queued_reqs" not in older.vllm_args and "has no --max-num-queued-reqs" in str(older.steps)


def test_a_max_model_len_that_does_not_fit_is_predicted_to_fail_as_vllm_says():
    start = predict_startup(
        HUNYUAN, lookup("RTX 3060"), max_model_len=131_072, max_num_seqs=256, max_num_batched_tokens=2048
    )
    assert start.error.startswith("To serve at least one request with the model's max seq len (131072)")
    assert start.kv_tokens < 131_072
    fits = predict_startup(
        HUNYUAN, lookup("RTX 3060"), max_model_len=20_875, max_num_seqs=2, max_num_batched_tokens=8192
    )
    assert fits.error is None and fits.max_concurrency > 1


def test_compare_defaults_shows_what_vllms_own_defaults_would_do():
    plan = plan_serving(HUNYUAN, lookup("RTX 3060"))
    rows = {row.flag: row for row in compare_defaults(plan)}
    assert rows["--max-model-len"].default == 131_072 and rows["--max-model-len"].planned == plan.value("page_tokens")
    assert rows["--max-model-len"].consequence.startswith("start-up fails: To serve at least one request")
    assert rows["--max-num-seqs"].default == 256 and "vLLM preempts pages" in rows["--max-num-seqs"].consequence
    assert rows["--max-num-batched-tokens"].default == 2048
    prefill = plan.value("visual_tokens") + plan.value("prompt_tokens")  # 16,651 at 4096^2 px
    assert f"split over {-(-prefill // 2048)} scheduler steps" in rows["--max-num-batched-tokens"].consequence
    qwen = {
        row.flag: row for row in compare_defaults(plan_serving(get_model("allenai/olmOCR-2-7B-1025"), lookup("H100")))
    }
    assert qwen["--max-num-seqs"].default == 1024 and qwen["--max-num-batched-tokens"].default == 8192
    assert "profiles its encoder with a video" in qwen["--limit-mm-per-prompt"].consequence


def test_plan_cli_compare_defaults_and_vllm_version():
    runner = CliRunner(env={"COLUMNS": "200"})
    table = runner.invoke(app, ["plan", "--gpu", "RTX 3060", "--compare-defaults"])
    assert table.exit_code == 0, table.output
    assert "vLLM 0.33.0 defaults vs the plan: tencent/HunyuanOCR on RTX 3060 12G" in table.stdout
    data = json.loads(
        runner.invoke(app, ["plan", "--gpu", "RTX 3060", "--compare-defaults", "--format", "json"]).stdout
    )
    assert (data["vllm_version"], data["model"], data["gpu"]) == ("0.33.0", "tencent/HunyuanOCR", "RTX 3060 12G")
    assert [row["flag"] for row in data["defaults"]] == [
        "--max-model-len",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--limit-mm-per-prompt",
    ]
    old = runner.invoke(app, ["plan", "--gpu", "L4", "--vllm-version", "0.18.1", "--format", "json"])
    assert old.exit_code == 0 and json.loads(old.stdout)["vllm_version"] == "0.18.1"
    refused = runner.invoke(app, ["plan", "--gpu", "L4", "--vllm-version", "0.8.5"])
    assert refused.exit_code == 2 and "older than 0.9.1" in refused.stderr


def test_a_plain_decoder_folder_plans_as_text_only(tmp_path):
    config = LLAMA_31_8B
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = plan_serving(get_model(str(tmp_path)), lookup("H100"), vllm_version="0.10.2")
    assert plan.value("visual_tokens") == 0 and plan.value("kv_bytes_per_token") == 131_072
    assert plan.value("encoder_activation_bytes") == 0
    argv = plan.argv()
    assert "--limit-mm-per-prompt" not in argv and "--mm-processor-kwargs" not in argv
    result = CliRunner().invoke(app, ["plan", "--profile", "", "--model", str(tmp_path), "--gpu", "H100"])
    assert result.exit_code == 0, result.output
