"""Planner: three model x GPU cases computed by hand, misfits, multi-GPU, renderers, the CLI, and
(where vLLM is importable) the planned argv through vLLM's own argument parser.

The hand arithmetic below uses the planner's constants, each sourced in ``ocrserve/gpu/planner.py``,
and plans for vLLM 0.33 (which charges its CUDA-graph estimate to the KV cache): reserves non-torch
0.3 GiB = 322,122,547 B and CUDA graphs 0.5 GiB = 536,870,912 B; GPU totals as CUDA reports them;
activations 2 B per value, two vision-encoder layers live; sampler 32 B per vocabulary entry per
sequence; KV blocks of 16 tokens;
``max_num_batched_tokens`` >= 8192.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil

import pytest
import typer
import yaml
from rich.console import Console
from typer.testing import CliRunner

from ocrserve.cli import plan as plan_cli
from ocrserve.cli.plan_render import render_argv, render_json, render_table, render_yaml
from ocrserve.gpu.planner import VIDEO_ARCHITECTURES, PlanError, plan_serving
from ocrserve.gpu.registry import GpuSpec, lookup
from ocrserve.models import get_model

GIB = 1024**3


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_hunyuan_on_rtx_4090d_with_a_2048_squared_budget():
    plan = plan_serving(
        get_model("tencent/HunyuanOCR"),
        lookup("RTX 4090D"),
        min_pixels=512 * 512,
        max_pixels=2048 * 2048,
        factor=32,
        vllm_version="0.33.0",
    )
    assert plan.vllm_version == "0.33.0" and plan.value("vllm_version") == "0.33.0"
    # visual: a square 2048x2048 page -> 64*(64+1)+2 = 4162; vLLM's 512x8192 profile image (area
    #   4,194,304, not resized) -> 256*(16+1)+2 = 4354; the larger: 4354
    # prompt: doc_parse prompt 209 bytes -> ceil(209/2) + 32 = 137
    # page:   4354 + 137 + 16384 (max_tokens) = 20875 tokens
    assert plan.value("visual_tokens") == 4354
    assert plan.value("page_tokens") == 20875
    # usable: CUDA's 23.64 GiB = 24,207 MiB = 25,382,879,232 B x 0.9 = 22,844,591,308
    assert plan.value("usable_bytes") == 22_844_591_308
    # weights: 996,208,112 params * 2 B = 1,992,416,224
    assert plan.value("weights_bytes") == 1_992_416_224
    # batched tokens: max(8192, 4354+137=4491 rounded up to 256 = 4608) = 8192
    # decoder activation: 8192 * (4*1024 + 3*3584) * 2 = 8192 * 14848 * 2 = 243,269,632
    assert plan.value("lm_activation_bytes") == 243_269_632
    # encoder: 8192 // 4354 = 1 page profiled; 2 live layers x 4354 tokens x 2^2 patches x (4*1152 + 3*4304)
    #   x 2 B = 1,220,513,280
    assert plan.value("encoder_activation_bytes") == 1_220_513_280
    # profile peak: max(decoder, encoder, sampler 9 x 120,818 x 32 = 34,795,584) = 1,220,513,280
    assert plan.value("activation_bytes") == 1_220_513_280
    # reserves (vLLM 0.33): non-torch 0.3 GiB 322,122,547 + CUDA graphs 536,870,912 = 858,993,459
    assert plan.value("reserve_bytes") == 858_993_459
    # non-KV: 1,992,416,224 + 1,220,513,280 + 16,777,216 encoder cache + 858,993,459 = 4,088,700,179
    # KV per token: 2 * 24 layers * 8 kv heads * 128 * 2 B = 98,304
    # KV tokens: (22,844,591,308 - 4,088,700,179) // 98,304 = 190,795 -> whole 16-token blocks: 190,784
    # pages: 9 x 20875 = 187,875 fit; 10 x 20875 = 208,750 do not
    assert plan.value("kv_bytes_per_token") == 98_304
    assert plan.value("seqs_by_memory") == 9
    assert plan.value("max_num_seqs") == 9
    assert plan.value("kv_tokens") == 190_784
    argv = plan.argv()
    assert argv[:3] == ["vllm", "serve", "tencent/HunyuanOCR"]
    assert _flag(argv, "--max-num-seqs") == "9"
    assert _flag(argv, "--max-num-batched-tokens") == "8192"
    assert _flag(argv, "--max-model-len") == "20875"
    assert _flag(argv, "--gpu-memory-utilization") == "0.9"
    assert json.loads(_flag(argv, "--limit-mm-per-prompt")) == {"image": 1}  # HunyuanOCR takes no video
    assert json.loads(_flag(argv, "--mm-processor-kwargs")) == {"min_pixels": 262144, "max_pixels": 4194304}
    assert _flag(argv, "--scheduling-policy") == "priority"
    # vLLM 0.29+ bounds its own queue: the 9 pages the gateway keeps in flight, 9 x (4354 + 137) prefill tokens
    assert (_flag(argv, "--max-num-queued-reqs"), _flag(argv, "--max-num-queued-tokens")) == ("9", "40419")
    assert argv[-3:] == ["--no-enable-prefix-caching", "--mm-processor-cache-gb", "0"]
    assert "--dtype" not in argv  # the 4090D computes in bf16


def test_olmocr2_on_a100_80g():
    plan = plan_serving(get_model("allenai/olmOCR-2-7B-1025"), lookup("A100 80G"), vllm_version="0.33.0")
    # visual: max_pixels 1288^2 = 1,658,944 // 28^2 = 2116; prompt: 557 bytes -> 279 + 32 = 311
    # page: 2116 + 311 + 8000 = 10427
    assert (plan.value("visual_tokens"), plan.value("prompt_tokens"), plan.value("page_tokens")) == (2116, 311, 10427)
    # usable: CUDA's 79.26 GiB = 81,162 MiB x 0.9 = 76,594,072,780
    # weights: 8,292,166,656 * 2 = 16,584,333,312
    # decoder activation: 8192 * (4*3584 + 3*18944) * 2 = 8192 * 71168 * 2 = 1,166,016,512
    # encoder: 8192 // 2116 = 3 pages profiled at once: 2 layers x 3 x 2116 x 4 x (4*1280 + 3*3420) x 2
    #   = 1,562,115,840 (above the decoder's)
    # non-KV: 16,584,333,312 + 1,562,115,840 + 58,720,256 + 858,993,459 = 19,064,162,867
    # KV tokens: (76,594,072,780 - 19,064,162,867) // 57,344 = 1,003,241 -> blocks of 16: 1,003,232
    # pages: 96 x 10427 = 1,000,992 fit, 97 x 10427 = 1,011,419 do not
    assert plan.value("usable_bytes") == 76_594_072_780
    assert plan.value("lm_activation_bytes") == 1_166_016_512
    assert plan.value("encoder_activation_bytes") == 1_562_115_840
    assert plan.value("max_num_seqs") == 96
    assert plan.value("kv_tokens") == 1_003_232
    argv = plan.argv()
    assert (_flag(argv, "--max-num-seqs"), _flag(argv, "--max-model-len")) == ("96", "10427")
    assert json.loads(_flag(argv, "--mm-processor-kwargs")) == {"min_pixels": 3136, "max_pixels": 1_658_944}
    # Qwen2.5-VL's processor takes video too: without "video": 0 vLLM profiles the encoder on a video
    assert json.loads(_flag(argv, "--limit-mm-per-prompt")) == {"image": 1, "video": 0}
    assert "--trust-remote-code" not in argv  # Qwen2.5-VL is native in vLLM


def test_paddleocr_vl_on_rtx_3060_12g():
    plan = plan_serving(get_model("PaddlePaddle/PaddleOCR-VL"), lookup("RTX 3060"), vllm_version="0.33.0")
    # visual: 2,822,400 // 784 = 3600; prompt: 'Table Recognition:' 18 bytes -> 9 + 32 = 41
    # page: 3600 + 41 + 8192 = 11833
    assert plan.value("page_tokens") == 11833
    # usable: CUDA's 11.76 GiB = 12,042 MiB x 0.9 = 11,364,256,972
    # weights: 905,601,648 * 2 = 1,811,203,296
    # encoder: 8192 // 3600 = 2 pages: 2 layers x 2 x 3600 x 4 x (4*1152 + 3*4304) x 2 = 2,018,304,000
    # non-KV: 1,811,203,296 + 2,018,304,000 + 16,777,216 + 858,993,459 = 4,705,277,971
    # KV tokens: (11,364,256,972 - 4,705,277,971) // 18,432 = 361,272 -> blocks of 16: 361,264
    # pages: 30 x 11833 = 354,990 fit, 31 x 11833 = 366,823 do not
    assert plan.value("usable_bytes") == 11_364_256_972
    assert plan.value("encoder_activation_bytes") == 2_018_304_000
    assert plan.value("max_num_seqs") == 30
    assert plan.value("kv_tokens") == 361_264
    argv = plan.argv()
    assert "--trust-remote-code" in argv and _flag(argv, "--max-num-seqs") == "30"


def test_p95_target_caps_max_num_seqs():
    plan = plan_serving(get_model("PaddlePaddle/PaddleOCR-VL"), lookup("RTX 3060"), p95_seconds=20)
    # p95 page: 2048 output tokens; mean context 3600 + 41 + 1024 = 4665 tokens
    # a step may stream 20 s / 2048 * (360e9 B/s * 0.8) = 2,812,500,000 B
    # B <= (2,812,500,000 - 1,811,203,296 weights) / (4665 * 18,432 B) = 1,001,296,704 / 85,985,280 = 11.6
    assert plan.value("seqs_by_p95") == 11
    assert plan.value("max_num_seqs") == 11  # min(memory 30, p95 11)
    with pytest.raises(PlanError, match="out of reach"):
        # one page alone: 2048 * (1,811,203,296 + 85,985,280) / 288e9 = 13.5 s > 10 s
        plan_serving(get_model("PaddlePaddle/PaddleOCR-VL"), lookup("RTX 3060"), p95_seconds=10)


def test_model_too_big_for_the_gpu_says_what_would_fit():
    with pytest.raises(PlanError) as err:
        plan_serving(get_model("Qwen/Qwen3-VL-8B-Instruct"), lookup("RTX 3060"))
    # 8,767,123,696 * 2 B = 16.33 GiB of weights > CUDA's 11.76 GiB * 0.9 = 10.58 GiB
    message = str(err.value)
    assert "does not fit" in message and "weights alone take 16.33 GiB of the 10.58 GiB" in message
    assert "a bigger GPU: L40S 48G" in message and "--gpus 4" in message


def test_page_too_big_suggests_a_smaller_budget():
    six_gib = GpuSpec("5.5 GiB card", 5632, (8, 6), 0.0)
    with pytest.raises(PlanError) as err:
        plan_serving(get_model("tencent/HunyuanOCR"), six_gib)
    message = str(err.value)
    assert "one page needs" in message and "max_pixels <=" in message
    suggested = int(message.split("max_pixels <= ")[1].split(" ")[0].replace(",", ""))
    plan = plan_serving(get_model("tencent/HunyuanOCR"), six_gib, max_pixels=suggested)  # the advice works
    assert plan.value("max_num_seqs") == 1
    # at 2048^2 px the page (4354 visual + 137 prompt + 16384 output) is what does not fit: fewer output tokens do
    with pytest.raises(PlanError) as err:
        plan_serving(get_model("tencent/HunyuanOCR"), six_gib, max_pixels=2048 * 2048)
    tokens = int(str(err.value).split("max_tokens <= ")[1].split(" ")[0])
    assert (
        plan_serving(get_model("tencent/HunyuanOCR"), six_gib, max_pixels=2048 * 2048, max_tokens=tokens).value(
            "max_num_seqs"
        )
        == 1
    )


def test_requested_max_num_seqs_beyond_memory_fails():
    with pytest.raises(PlanError, match="memory holds 30 pages"):
        plan_serving(get_model("PaddlePaddle/PaddleOCR-VL"), lookup("RTX 3060"), max_num_seqs=64)
    plan = plan_serving(get_model("PaddlePaddle/PaddleOCR-VL"), lookup("RTX 3060"), max_num_seqs=8)
    assert plan.value("max_num_seqs") == 8


def test_preprocessor_factor_must_match_the_model():
    with pytest.raises(PlanError, match="preprocess.factor: 32"):
        plan_serving(get_model("tencent/HunyuanOCR"), lookup("RTX 4090D"), factor=28)


def test_page_longer_than_the_model_context_fails():
    with pytest.raises(PlanError, match="supports 8192"):
        plan_serving(get_model("deepseek-ai/DeepSeek-OCR"), lookup("A100 80G"), max_tokens=8192)


def test_turing_gpu_gets_half_precision_and_tiling_model_no_pixel_kwargs():
    plan = plan_serving(get_model("deepseek-ai/DeepSeek-OCR"), lookup("T4"))
    argv = plan.argv()
    assert _flag(argv, "--dtype") == "half"  # vLLM: bf16 needs compute capability >= 8.0
    assert "--mm-processor-kwargs" not in argv  # DeepSeek-OCR tiles pages itself
    assert _flag(argv, "--logits-processors").endswith("deepseek_ocr:NGramPerReqLogitsProcessor")
    # page: 933 visual + 55 prompt + 7168 output = 8156 <= 8192 context
    assert plan.value("page_tokens") == 933 + 55 + 7168


def test_two_gpus_small_model_runs_replicas():
    one = plan_serving(get_model("tencent/HunyuanOCR"), lookup("RTX 4090D"))
    two = plan_serving(get_model("tencent/HunyuanOCR"), lookup("RTX 4090D"), gpus=2)
    assert two.strategy == "replicas"
    assert _flag(two.argv(), "--data-parallel-size") == "2"
    assert two.value("max_num_seqs") == one.value("max_num_seqs")  # per replica
    assert two.value("parallel.replicas") == 2 * one.value("max_num_seqs")
    assert "m/(m+n-1) = 2/(2+2-1) = 0.67" in next(s.derivation for s in two.steps if s.key == "parallel.pipeline")


def test_two_gpus_large_model_needs_tensor_parallelism():
    plan = plan_serving(get_model("allenai/olmOCR-2-7B-1025"), lookup("RTX 3060"), gpus=2)
    # one 3060: 16.58e9 B of weights > 10.8 GiB; split over 2 (28 heads, 4 KV heads divide by 2) it fits
    assert plan.strategy == "tensor"
    assert _flag(plan.argv(), "--tensor-parallel-size") == "2"
    assert plan.value("weights_bytes") == 16_584_333_312 // 2
    assert plan.value("kv_bytes_per_token") == 2 * 28 * (4 // 2) * 128 * 2


def test_overrides_pass_through_and_are_checked():
    plan = plan_serving(
        get_model("PaddlePaddle/PaddleOCR-VL"),
        lookup("RTX 3060"),
        overrides={"max_num_seqs": "auto", "enforce_eager": True, "swap_space": 0},
    )
    argv = plan.argv()
    assert "--enforce-eager" in argv and _flag(argv, "--swap-space") == "0"
    with pytest.raises(PlanError, match="below"):
        plan_serving(get_model("PaddlePaddle/PaddleOCR-VL"), lookup("RTX 3060"), overrides={"max_model_len": 4096})


def test_a_max_model_len_beyond_the_cache_or_the_positions_is_refused_with_what_fits():
    model, gpu = get_model("tencent/HunyuanOCR"), lookup("RTX 3060 12G")
    kv_tokens = plan_serving(model, gpu).value("kv_tokens")
    assert kv_tokens < model.max_position_embeddings == 131_072
    with pytest.raises(PlanError, match=r"above the 131,072 positions tencent/HunyuanOCR supports; at most "):
        plan_serving(model, gpu, overrides={"max_model_len": 500_000})
    with pytest.raises(PlanError, match=rf"the KV cache holds {kv_tokens:,} tokens .*; at most {kv_tokens:,}$"):
        plan_serving(model, gpu, overrides={"max_model_len": kv_tokens + 16})
    assert plan_serving(model, gpu, overrides={"max_model_len": kv_tokens}).vllm_args["max_model_len"] == kv_tokens


def test_plan_takes_set_like_launch():
    result = CliRunner().invoke(
        _cli(), ["plan", "--gpu", "RTX 4090", "--format", "json", "--set", "preprocess.max_pixels=1048576"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["vllm_args"]["mm_processor_kwargs"]["max_pixels"] == 1_048_576
    refused = CliRunner().invoke(_cli(), ["plan", "--gpu", "RTX 4090", "--set", "vllm.max_model_len=500000"])
    assert refused.exit_code == 2 and "above the 131,072 positions" in " ".join(refused.stderr.split())
    alone = CliRunner().invoke(_cli(), ["plan", "--profile", "", "--set", "vllm.max_num_seqs=4"])
    assert alone.exit_code == 2 and "name the profile" in alone.stderr


@pytest.mark.parametrize("memory", ["inf", "1e9"])
def test_gpu_memory_must_be_a_finite_size(memory):
    result = CliRunner().invoke(_cli(), ["plan", "--gpu-memory", memory])
    assert result.exit_code == 2
    assert "GPU memory must be a finite number of GiB from 1 to 1024" in result.stderr


def test_renderers():
    plan = plan_serving(get_model("PaddlePaddle/PaddleOCR-VL"), lookup("RTX 3060"))
    assert shlex.split(render_argv(plan)) == plan.argv()
    data = json.loads(render_json(plan))
    assert data["vllm_args"]["max_num_seqs"] == 30 and data["argv"] == plan.argv()
    assert {s["key"] for s in data["steps"]} >= {"weights_bytes", "kv_bytes_per_token", "max_num_seqs"}
    assert yaml.safe_load(render_yaml(plan)) == data
    console = Console(record=True, width=250)
    console.print(render_table(plan))
    text = console.export_text()
    assert "KV cache per token" in text and "18.00 KiB" in text and "--max-num-seqs 30" in text
    assert "[https://" in text  # sources survive Rich markup


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command(name="plan")(plan_cli.plan)
    app.command(name="models")(plan_cli.models)
    return app


def test_cli_plan_formats_and_errors():
    runner = CliRunner()
    result = runner.invoke(
        _cli(),
        ["plan", "--profile", "", "--gpu", "RTX 3060", "--model", "PaddlePaddle/PaddleOCR-VL", "--format", "json"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["vllm_args"]["max_num_seqs"] == 30
    result = runner.invoke(
        _cli(), ["plan", "--profile", "", "--gpu", "rtx-4090d", "--max-pixels", str(2048 * 2048), "--format", "argv"]
    )
    assert result.exit_code == 0
    assert shlex.split(result.stdout)[:3] == ["vllm", "serve", "tencent/HunyuanOCR"]
    assert "--max-num-seqs 9" in result.stdout
    result = runner.invoke(_cli(), ["plan", "--profile", "", "--gpu", "Voodoo 5"])
    assert result.exit_code == 2 and "unknown GPU" in result.stderr
    result = runner.invoke(_cli(), ["plan", "--profile", "", "--gpu-memory", "24", "--gpus", "2", "--format", "yaml"])
    assert result.exit_code == 0 and yaml.safe_load(result.stdout)["strategy"] == "replicas"


def test_cli_plan_takes_the_profile_budget_only_for_the_profile_model():
    """--model with another model than the profile's plans at that model's own pixel budget and
    factor (the prod profile's factor 32 would not fit a factor-28 model); the profile's vLLM
    settings still apply."""
    runner = CliRunner()
    result = runner.invoke(
        _cli(), ["plan", "--model", "PaddlePaddle/PaddleOCR-VL", "--gpu", "rtx3060", "--p95", "20", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["vllm_args"]["scheduling_policy"] == "priority"
    result = runner.invoke(
        _cli(), ["plan", "--model", "allenai/olmOCR-2-7B-1025", "--gpu", "a100-80g", "--format", "json"]
    )
    assert result.exit_code == 0 and json.loads(result.stdout)["vllm_args"]["max_num_seqs"] == 96


@pytest.mark.parametrize(
    "args, message",
    [
        (["--profile", "nosuch"], "nosuch"),
        (["--max-pixels", "0"], "max-pixels"),
        (["--max-pixels", "100"], "below min_pixels"),
        (["--max-tokens", "0"], "max-tokens"),
        (["--gpus", "0"], "gpus"),
        (["--gpu-memory", "-5"], "gpu-memory"),
        (["--gpu-memory-utilization", "0"], "gpu-memory-utilization"),
    ],
)
def test_cli_plan_refuses_impossible_values(args, message):
    result = CliRunner().invoke(_cli(), ["plan", "--gpu", "RTX 4090D", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_cli_models_lists_the_registry():
    result = CliRunner().invoke(_cli(), ["models"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in ("tencent/HunyuanOCR", "PaddlePaddle/PaddleOCR-VL", "allenai/olmOCR-2-7B-1025", "96 KiB"):
        assert name in result.stdout


def _vllm_parser():
    if shutil.which("nvidia-smi") is None:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # let vLLM build its config on a CPU-only machine
    pytest.importorskip("vllm", reason="vLLM's own parser needs vllm: pip install -e '.[vllm]'")
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # vLLM < 0.11.1
        from vllm.utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:  # before vLLM moved it to entrypoints.launchers (0.32.0 has it there)
        try:
            from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
        except ImportError:  # vLLM before the entrypoints reorganisation
            from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    return make_arg_parser(FlexibleArgumentParser()), validate_parsed_serve_args


@pytest.mark.vllm
def test_planned_argv_parses_with_vllms_own_parser():
    parser, validate = _vllm_parser()
    with pytest.raises(SystemExit):  # the parser does reject what it does not know
        parser.parse_args(["tencent/HunyuanOCR", "--max-num-seqz", "4"])
    cases = [
        ("tencent/HunyuanOCR", "RTX 4090D", 1),
        ("tencent/HunyuanOCR", "RTX 4090D", 2),
        ("PaddlePaddle/PaddleOCR-VL", "RTX 3060", 1),
        ("deepseek-ai/DeepSeek-OCR", "T4", 1),
        ("rednote-hilab/dots.ocr", "L40S", 1),
        ("allenai/olmOCR-2-7B-1025", "A100 80G", 1),
        ("allenai/olmOCR-2-7B-1025", "RTX 3060", 2),
        ("zai-org/GLM-OCR", "L4", 1),
        ("Qwen/Qwen3-VL-8B-Instruct", "H100", 1),
    ]
    eager_fp8 = {"kv_cache_dtype": "fp8", "enforce_eager": True}
    for model, gpu, count, overrides in [(*case, {}) for case in cases] + [(*cases[-1], eager_fp8)]:
        plan = plan_serving(get_model(model), lookup(gpu), gpus=count, overrides=overrides)
        argv = plan.argv()
        assert argv[:2] == ["vllm", "serve"]
        args = parser.parse_args(argv[2:])
        validate(args)
        assert args.model_tag == model
        assert args.max_num_seqs == plan.value("max_num_seqs")
        assert args.max_model_len == plan.value("max_model_len")
        assert args.max_num_batched_tokens == plan.value("max_num_batched_tokens")
        video = {"video": 0} if plan.model.architecture in VIDEO_ARCHITECTURES else {}
        assert args.limit_mm_per_prompt == {"image": 1, **video}
        assert (args.max_num_queued_reqs, args.max_num_queued_tokens) == (
            plan.vllm_args["max_num_queued_reqs"],
            plan.vllm_args["max_num_queued_tokens"],
        )
        if overrides:
            assert (args.kv_cache_dtype, args.enforce_eager) == ("fp8", True)
        assert args.scheduling_policy == "priority"
        assert args.enable_prefix_caching is False and args.mm_processor_cache_gb == 0
        if plan.model.supports_pixel_budget:
            assert set(args.mm_processor_kwargs) == {"min_pixels", "max_pixels"}


def test_planner_is_math_and_the_cli_renders():
    # layers: the planner returns data; the renderers live in the CLI; the launchers import no CLI
    import ast
    from pathlib import Path

    from ocrserve import gateway
    from ocrserve.gpu import launcher, planner

    assert not any(hasattr(planner, name) for name in ("render_table", "render_yaml", "render_json", "RENDERERS"))
    for module in (planner, launcher, gateway):
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        assert not [name for name in imported if name.startswith(("ocrserve.cli", "rich"))], module.__name__
