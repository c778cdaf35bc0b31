"""scripts/gpu_check.py: the no-GPU exit and the planner rows it compares against.

The measuring path needs an NVIDIA GPU and is not run here; these tests cover what a CPU-only
machine can: the one-line exit 2 without a GPU, and the estimate column, which must be the
planner's own numbers for the same plan.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ocrserve.gpu.planner import plan_serving
from ocrserve.gpu.registry import lookup
from ocrserve.models import get_model
from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def _load_script():
    return load_script("gpu_check")


def test_no_gpu_exits_2_with_one_line():
    torch = pytest.importorskip("torch", reason="the no-GPU path needs torch: pip install -e '.[debug]'")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the no-GPU path does not apply")
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpu_check: no GPU: torch.cuda.is_available() is False")
    assert result.stdout == ""


def test_estimates_are_the_planners_own():
    gpu_check = _load_script()
    model, gpu = get_model("tencent/HunyuanOCR"), lookup("RTX 4090D")
    budget = gpu_check.profile_budget("prod", model)
    assert budget == {"min_pixels": 512 * 512, "max_pixels": 2048 * 2048, "factor": 32}
    est = gpu_check.gather_estimates(model, gpu, **budget)
    plan = plan_serving(model, gpu, **budget)
    assert est.plan.argv() == plan.argv()
    rows = {row.key: row for row in gpu_check.estimate_rows(est)}
    assert rows["weights"].estimate == plan.value("weights_bytes") == 1_992_416_224
    assert rows["vision_activation"].estimate == plan.value("encoder_activation_bytes") == 1_220_513_280
    assert rows["prefill_activation"].estimate == plan.value("lm_activation_bytes") == 243_269_632
    seqs, page = plan.value("max_num_seqs"), plan.value("page_tokens")
    assert (seqs, page) == (9, 20875)
    kv = plan.value("kv_bytes_per_token") * page
    assert rows["kv_per_seq"].estimate == kv
    assert rows["kv_batch"].estimate == seqs * kv
    assert rows["decode_step"].estimate == seqs * plan.value("sampler_bytes_per_seq")
    assert rows["outside_allocator"].estimate == plan.value("cuda_context_bytes")
    assert rows["total"].estimate == (
        plan.value("weights_bytes")
        + max(plan.value("lm_activation_bytes"), plan.value("encoder_activation_bytes"))
        + plan.value("encoder_cache_bytes")
        + seqs * (kv + plan.value("sampler_bytes_per_seq"))
    )
    assert "kv_planned" not in rows  # the plan's own batch: no extra row
    assert all(row.measured is None and row.ratio is None for row in rows.values())


def test_capped_batch_adds_the_planned_row_and_explains():
    gpu_check = _load_script()
    model, gpu = get_model("tencent/HunyuanOCR"), lookup("RTX 4090D")
    est = gpu_check.gather_estimates(model, gpu, **gpu_check.profile_budget("prod", model))
    args = type("Args", (), {"context": None, "max_seqs": None, "headroom_gib": 2.0})()
    # 10 GiB free: 10 - 2 headroom = 8 GiB; each sequence needs its 1.91 GiB KV + sampler + the
    # repeat_kv copy of one layer (1.91 GiB x 16 heads / (24 layers x 8 KV heads)) -> 3 fit
    seqs, context, note = gpu_check.decide_batch(model, est, 10 * 1024**3, args)
    assert (seqs, context) == (3, 20875)
    assert "batch capped from 9 to 3" in note and "no paging" in note
    rows = {row.key: row for row in gpu_check.estimate_rows(est, seqs, context)}
    assert rows["kv_batch"].estimate == 3 * est.kv_per_seq(20875)
    assert rows["kv_planned"].estimate == 9 * est.kv_per_seq(20875)


def test_worst_page_costs_the_planned_visual_tokens():
    gpu_check = _load_script()
    model, gpu = get_model("tencent/HunyuanOCR"), lookup("RTX 4090D")
    est = gpu_check.gather_estimates(model, gpu, **gpu_check.profile_budget("prod", model))
    height, width = gpu_check.worst_page(model, est)
    assert (height, width) == (8192, 512)  # vLLM's profiling image, within 2048^2 px
    assert model.visual_tokens(height, width) == est.visual_tokens == 4354


def test_estimates_only_runs_without_a_gpu(tmp_path):
    out = tmp_path / "est.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--estimates-only", "--gpu", "RTX 4090D", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "KV cache x 9 sequences" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["plan"]["vllm_args"]["max_num_seqs"] == 9
    assert {row["key"] for row in doc["rows"]} >= {"weights", "vision_activation", "kv_batch", "total"}
