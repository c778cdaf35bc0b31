"""Local checkpoint folders: validated reading, weight bytes per quantization, text-only decoders."""

from __future__ import annotations

import json
import math

import pytest

from ocrserve.models import DEFAULT_MODEL, REGISTRY, TEXT, ModelError, estimate_parameters, get_model
from ocrserve.models.checkpoint import TextConfig, decoder_linears

# Llama-3.1-8B-Instruct config.json (https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json)
LLAMA_31_8B = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "rope_type": "llama3"},
}
LLAMA_31_8B_PARAMETERS = 8_030_261_248
"""Llama-3.1-8B's exact count (model card '8B'; safetensors index total_size 16,060,522,496 B / 2)."""

# Qwen2.5-7B-Instruct-AWQ config.json (https://huggingface.co/Qwen/Qwen2.5-7B-Instruct-AWQ/blob/main/config.json)
QWEN25_7B_AWQ = {
    "model_type": "qwen2",
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "quantization_config": {
        "bits": 4,
        "group_size": 128,
        "modules_to_not_convert": None,
        "quant_method": "awq",
        "version": "gemm",
        "zero_point": True,
    },
}
QWEN25_7B_AWQ_BYTES = 5_580_000_000
"""The released checkpoint's weights, about 5.58 GB: the Hub lists two shards of 3.99 GB and 1.59 GB
(https://huggingface.co/Qwen/Qwen2.5-7B-Instruct-AWQ/tree/main). Rounded to the listing's precision;
the index's exact ``total_size`` was not at hand, hence the 3% tolerance."""


def _write(folder, name, data):
    (folder / name).write_text(data if isinstance(data, str) else json.dumps(data))


def _error(folder) -> str:
    with pytest.raises(ModelError) as err:
        get_model(str(folder))
    assert isinstance(err.value, ModelError)
    return str(err.value)


def _vlm(**changes):
    """A Qwen2.5-VL-3B-shaped config (a registry model_type), with ``changes``."""
    config = {
        "model_type": "qwen2_5_vl",
        "torch_dtype": "bfloat16",
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 128000,
        "vision_config": {"depth": 32, "hidden_size": 1280, "patch_size": 14, "spatial_merge_size": 2},
    }
    return {**config, **changes}


# ---------------------------------------------------------------------------------------------
# Malformed files: ModelError naming the file and the key path, never a traceback
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, expected",
    [
        ([LLAMA_31_8B], "config.json: expected a JSON object, got a list"),
        ({**LLAMA_31_8B, "num_hidden_layers": 0}, "config.json: num_hidden_layers: expected a positive integer, got 0"),
        ({**LLAMA_31_8B, "num_attention_heads": -32}, "num_attention_heads: expected a positive integer, got -32"),
        ({**LLAMA_31_8B, "num_key_value_heads": 0}, "num_key_value_heads: expected a positive integer, got 0"),
        ({**LLAMA_31_8B, "num_key_value_heads": 5}, "num_key_value_heads: 5 does not divide num_attention_heads 32"),
        ({**LLAMA_31_8B, "hidden_size": None}, "hidden_size: expected a positive integer, got null"),
        ({**LLAMA_31_8B, "hidden_size": "4096"}, "hidden_size: expected a positive integer, got '4096'"),
        ({**LLAMA_31_8B, "intermediate_size": 14336.0}, "intermediate_size: expected a positive integer, got 14336.0"),
        ({**LLAMA_31_8B, "vocab_size": True}, "vocab_size: expected a positive integer, got true"),
        ({k: v for k, v in LLAMA_31_8B.items() if k != "vocab_size"}, "vocab_size: required, missing"),
        (
            {**LLAMA_31_8B, "hidden_size": 4100, "num_attention_heads": 32, "num_key_value_heads": 8},
            "hidden_size: 4100",
        ),
        ({**LLAMA_31_8B, "torch_dtype": "int8"}, "torch_dtype: 'int8' is not a dtype the planner knows"),
        ({**LLAMA_31_8B, "torch_dtype": ["bfloat16"]}, "torch_dtype: a list is not a dtype the planner knows"),
        ({**LLAMA_31_8B, "model_type": 7}, "model_type: expected a string, got 7"),
        (
            {**LLAMA_31_8B, "quantization_config": {"quant_method": "hqq", "nbits": 4}},
            "quantization_config.quant_method: 'hqq' is not a quantization the planner can size; "
            "supported: awq, bitsandbytes, fp8, gptq",
        ),
        ({**LLAMA_31_8B, "quantization_config": ["awq"]}, "quantization_config: expected a JSON object, got a list"),
        (
            {**LLAMA_31_8B, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": "128"}},
            "quantization_config.group_size: expected a positive integer, got '128'",
        ),
        (
            {**LLAMA_31_8B, "quantization_config": {"quant_method": "gptq", "bits": 4}},
            "quantization_config.group_size: required, missing",
        ),
        (
            {**LLAMA_31_8B, "quantization_config": {"quant_method": "bitsandbytes"}},
            "load_in_4bit/load_in_8bit: exactly one must be true",
        ),
        (
            {**LLAMA_31_8B, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 0]}},
            "quantization_config.weight_block_size.1: expected a positive integer, got 0",
        ),
        (_vlm(vision_config=[1280]), "config.json: vision_config: expected a JSON object, got a list"),
        (_vlm(vision_config={"depth": 32, "hidden_size": "1280"}), "vision_config.hidden_size"),
    ],
)
def test_malformed_config_names_file_and_field(tmp_path, config, expected):
    _write(tmp_path, "config.json", config)
    message = _error(tmp_path)
    assert str(tmp_path / "config.json") in message and expected in message, message
    assert "Traceback" not in message and "pydantic" not in message


def test_nested_text_config_fields_are_named_by_their_path(tmp_path):
    text = {"hidden_size": 2048, "num_hidden_layers": 0, "num_attention_heads": 16, "vocab_size": 151936}
    _write(tmp_path, "config.json", {"model_type": "qwen3_vl", "text_config": text, "vision_config": {}})
    assert "config.json: text_config.num_hidden_layers: expected a positive integer, got 0" in _error(tmp_path)

    text.update(num_hidden_layers=28, num_key_value_heads=3)
    _write(tmp_path, "config.json", {"model_type": "qwen3_vl", "text_config": text})
    assert "text_config.num_key_value_heads: 3 does not divide text_config.num_attention_heads 16" in _error(tmp_path)

    _write(tmp_path, "config.json", {"model_type": "qwen3_vl", "text_config": [text]})
    assert "config.json: text_config: expected a JSON object, got a list" in _error(tmp_path)


@pytest.mark.parametrize(
    "name, data, expected",
    [
        ("preprocessor_config.json", {"max_pixels": "1000"}, "max_pixels: expected a positive integer, got '1000'"),
        ("preprocessor_config.json", {"min_pixels": None, "max_pixels": 0}, "max_pixels: expected a positive integer"),
        (
            "preprocessor_config.json",
            {"size": {"longest_edge": "big"}},
            "size.longest_edge: expected a positive integer",
        ),
        ("preprocessor_config.json", {"min_pixels": 10**6, "max_pixels": 3136}, "min_pixels: 1000000 exceeds"),
        ("preprocessor_config.json", [3136, 1003520], "expected a JSON object, got a list"),
        ("preprocessor_config.json", "{min_pixels: 3136}", "not valid JSON"),
        (
            "model.safetensors.index.json",
            {"metadata": {"total_size": "7 GB"}, "weight_map": {}},
            "metadata.total_size: expected a positive integer of bytes up to 1 PiB, got '7 GB'",
        ),
        ("model.safetensors.index.json", {"metadata": {"total_size": -1}}, "metadata.total_size: expected a positive"),
        ("model.safetensors.index.json", {"metadata": {"total_size": [1]}}, "metadata.total_size: expected a positive"),
        ("model.safetensors.index.json", {"metadata": "7e9"}, "metadata: expected a JSON object, got '7e9'"),
        ("model.safetensors.index.json", "", "not valid JSON"),
    ],
)
def test_malformed_side_file_names_file_and_field(tmp_path, name, data, expected):
    _write(tmp_path, "config.json", _vlm())
    _write(tmp_path, name, data)
    message = _error(tmp_path)
    assert str(tmp_path / name) in message and expected in message, message


def test_invalid_config_json_names_the_file(tmp_path):
    _write(tmp_path, "config.json", '{"model_type": "llama", "hidden_size": 4096,')
    message = _error(tmp_path)
    assert message.startswith(f"{tmp_path / 'config.json'}: not valid JSON")


def test_unsupported_model_type_lists_vlms_and_decoders(tmp_path):
    _write(tmp_path, "config.json", {**LLAMA_31_8B, "model_type": "qwen3_moe"})
    message = _error(tmp_path)
    assert "model_type 'qwen3_moe' is not supported" in message
    for kind in ("llama", "mistral", "qwen2", "qwen3", "qwen2_5_vl", "hunyuan_vl"):
        assert kind in message


def test_estimate_parameters_validates_plain_mappings():
    assert estimate_parameters(LLAMA_31_8B, {}) == get_parameters_of(LLAMA_31_8B)
    with pytest.raises(ModelError, match="num_hidden_layers: expected a positive integer, got '32'"):
        estimate_parameters({**LLAMA_31_8B, "num_hidden_layers": "32"}, {})


def get_parameters_of(config: dict) -> int:
    text = TextConfig.model_validate(config)
    return text.vocab_size * text.hidden_size * 2 + text.num_hidden_layers * sum(
        i * o for i, o in decoder_linears(text)
    )


# ---------------------------------------------------------------------------------------------
# Text-only decoders
# ---------------------------------------------------------------------------------------------


def test_llama_31_8b_plans_as_text_only(tmp_path):
    _write(tmp_path, "config.json", LLAMA_31_8B)
    spec = get_model(str(tmp_path))
    # 2 (K,V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes
    assert spec.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131_072
    # embeddings 2 x 128256 x 4096 + 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336); norms omitted
    assert spec.parameters == 2 * 128256 * 4096 + 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    assert abs(spec.parameters / LLAMA_31_8B_PARAMETERS - 1) < 0.01
    assert spec.weights_bytes == spec.parameters * 2 and spec.weight_bytes == 0 and spec.quantization == ""
    assert (spec.token_formula, spec.architecture, spec.dtype) == (TEXT, "llama", "bfloat16")
    assert not spec.supports_pixel_budget
    assert spec.max_visual_tokens() == spec.visual_tokens(3508, 2480) == 0
    assert (spec.min_pixels, spec.max_pixels, spec.profile_image, spec.tiles) == (None, None, None, {})
    assert (spec.vision_hidden_size, spec.vision_intermediate_size, spec.factor) == (0, 0, 1)
    assert spec.max_position_embeddings == 131072
    recipe = REGISTRY[DEFAULT_MODEL]
    assert spec.prompts == recipe.prompts and spec.max_tokens == recipe.max_tokens
    assert spec.vllm_flags == ("--no-enable-prefix-caching",)
    assert "cannot OCR" in spec.notes and "text-only" in spec.notes
    for key in ("parameters", "weight_bytes", "prompts", "sampling", "token_formula", "dtype", "num_kv_heads"):
        assert spec.sources[key].strip(), key
    assert str(tmp_path / "config.json") in spec.sources["num_kv_heads"]


def test_llama_index_total_size_used_verbatim(tmp_path):
    _write(tmp_path, "config.json", LLAMA_31_8B)
    _write(tmp_path, "model.safetensors.index.json", {"metadata": {"total_size": 16_060_522_496}, "weight_map": {}})
    spec = get_model(str(tmp_path))
    assert spec.weight_bytes == spec.weights_bytes == 16_060_522_496
    assert spec.parameters == LLAMA_31_8B_PARAMETERS  # total_size / 2 (bf16)
    assert "total_size" in spec.sources["weight_bytes"]


@pytest.mark.parametrize("total", ["16060522496", 16060522496.0])
def test_numeric_total_size_spellings_are_accepted(tmp_path, total):
    _write(tmp_path, "config.json", LLAMA_31_8B)
    _write(tmp_path, "model.safetensors.index.json", {"metadata": {"total_size": total}})
    assert get_model(str(tmp_path)).weight_bytes == 16_060_522_496


def test_safetensors_files_sized_without_an_index(tmp_path):
    _write(tmp_path, "config.json", LLAMA_31_8B)
    sizes = {"model-00001-of-00002.safetensors": 10_000_000_000, "model-00002-of-00002.safetensors": 6_060_000_000}
    for name, size in {**sizes, "consolidated.safetensors": 16_060_000_000}.items():  # Mistral's second layout
        with open(tmp_path / name, "wb") as fh:
            fh.truncate(size)  # sparse: the size without the disk
    spec = get_model(str(tmp_path))
    assert spec.weight_bytes == 16_060_000_000 and spec.parameters == 8_030_000_000
    assert "2 safetensors file(s)" in spec.sources["weight_bytes"]


def test_weight_files_far_smaller_than_the_config_are_refused(tmp_path):
    _write(tmp_path, "config.json", LLAMA_31_8B)
    (tmp_path / "model.safetensors").write_bytes(b"\0\0")
    with pytest.raises(
        ModelError, match=r"1 safetensors file\(s\) in .*, 2 bytes: 2 bytes of weights, under 50% of the .* a truncated"
    ):
        get_model(str(tmp_path))


def test_mistral_sliding_window_is_a_note(tmp_path):
    config = {**LLAMA_31_8B, "model_type": "mistral", "vocab_size": 32000, "sliding_window": 4096}
    _write(tmp_path, "config.json", config)
    spec = get_model(str(tmp_path))
    assert spec.architecture == "mistral" and "sliding_window 4096" in spec.notes
    assert spec.kv_bytes_per_token() == 131_072  # not modelled: full attention


def test_qwen3_without_dtype_or_max_position_falls_back_with_a_note(tmp_path):
    config = {k: v for k, v in LLAMA_31_8B.items() if k not in ("torch_dtype", "max_position_embeddings")}
    _write(tmp_path, "config.json", {**config, "model_type": "qwen3", "head_dim": 128, "tie_word_embeddings": True})
    spec = get_model(str(tmp_path))
    assert spec.dtype == "bfloat16" and "no torch_dtype" in spec.sources["dtype"]
    assert spec.max_position_embeddings == REGISTRY[DEFAULT_MODEL].max_position_embeddings
    assert "no max_position_embeddings" in spec.notes


# ---------------------------------------------------------------------------------------------
# Quantized weights
# ---------------------------------------------------------------------------------------------


def _qwen_linears() -> int:
    """Weights in the decoder linears of Qwen2.5-7B: 28 x (q, k, v, o, gate, up, down)."""
    return 28 * (2 * 3584 * 3584 + 2 * 3584 * 512 + 3 * 3584 * 18944)


QWEN_EMBEDDINGS = 2 * 152064 * 3584  # untied embed_tokens + lm_head


def test_qwen25_7b_awq_weight_bytes_match_the_release(tmp_path):
    _write(tmp_path, "config.json", QWEN25_7B_AWQ)
    spec = get_model(str(tmp_path))
    w = _qwen_linears()
    # AWQ: 4 bits a weight, per 128-weight group one fp16 scale and one 4-bit zero; embeddings fp16
    assert spec.weight_bytes == w // 2 + w // 128 * (2 * 8 + 4) // 8 + QWEN_EMBEDDINGS * 2
    assert abs(spec.weight_bytes / QWEN25_7B_AWQ_BYTES - 1) < 0.03
    assert spec.weights_bytes == spec.weight_bytes
    assert spec.parameters == w + QWEN_EMBEDDINGS  # the unquantized count
    assert (spec.quantization, spec.dtype, spec.token_formula) == ("awq", "float16", TEXT)
    assert "awq 4-bit, group 128" in spec.sources["weight_bytes"]
    assert "sliding_window" not in spec.notes  # use_sliding_window is false


def test_quantized_index_total_size_is_the_weights_and_parameters_come_from_config(tmp_path):
    _write(tmp_path, "config.json", QWEN25_7B_AWQ)
    _write(tmp_path, "model.safetensors.index.json", {"metadata": {"total_size": 5_583_428_608}, "weight_map": {}})
    spec = get_model(str(tmp_path))
    assert spec.weight_bytes == 5_583_428_608  # verbatim: packed as vLLM loads it
    assert spec.parameters == _qwen_linears() + QWEN_EMBEDDINGS  # not total_size / 2
    assert "estimated" in spec.sources["parameters"] and "total_size" in spec.sources["weight_bytes"]


def test_fp8_block_quantized_weight_bytes(tmp_path):
    quant = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    _write(tmp_path, "config.json", {**QWEN25_7B_AWQ, "torch_dtype": "bfloat16", "quantization_config": quant})
    spec = get_model(str(tmp_path))
    shapes = [(3584, 3584), (3584, 512), (3584, 512), (3584, 3584), (3584, 18944), (3584, 18944), (18944, 3584)]
    scales = 28 * sum(math.ceil(i / 128) * math.ceil(o / 128) for i, o in shapes) * 4  # fp32 weight_scale_inv
    assert spec.weight_bytes == _qwen_linears() + scales + QWEN_EMBEDDINGS * 2  # 1 B a linear weight, bf16 rest
    assert spec.quantization == "fp8" and spec.dtype == "bfloat16"
    # per-tensor FP8: one fp32 scale per linear
    _write(tmp_path, "config.json", {**QWEN25_7B_AWQ, "quantization_config": {"quant_method": "FP8"}})
    assert get_model(str(tmp_path)).weight_bytes == _qwen_linears() + 28 * 7 * 4 + QWEN_EMBEDDINGS * 2


def test_gptq_and_bitsandbytes_weight_bytes(tmp_path):
    gptq = {"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": False, "sym": True}
    _write(tmp_path, "config.json", {**QWEN25_7B_AWQ, "quantization_config": gptq})
    spec = get_model(str(tmp_path))
    shapes = [(3584, 3584), (3584, 512), (3584, 512), (3584, 3584), (3584, 18944), (3584, 18944), (18944, 3584)]
    per_layer = sum(i * o + o * (2 + 1) + 4 * i for i, o in shapes)  # int8 + one fp16 scale/8-bit zero a column + g_idx
    assert spec.weight_bytes == 28 * per_layer + QWEN_EMBEDDINGS * 2 and spec.quantization == "gptq"

    bnb = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": False}
    _write(tmp_path, "config.json", {**QWEN25_7B_AWQ, "torch_dtype": "bfloat16", "quantization_config": bnb})
    four = get_model(str(tmp_path))
    per_layer = sum(i * o // 2 + 4 * math.ceil(i * o / 64) for i, o in shapes)  # nf4 + fp32 absmax per 64
    assert four.weight_bytes == 28 * per_layer + QWEN_EMBEDDINGS * 2 and four.quantization == "bitsandbytes"

    _write(tmp_path, "config.json", {**QWEN25_7B_AWQ, "quantization_config": {"load_in_8bit": True}})
    eight = get_model(str(tmp_path))  # transformers < 4.37 wrote no quant_method
    assert eight.quantization == "bitsandbytes" and eight.weight_bytes > four.weight_bytes


def test_quantized_vlm_keeps_its_vision_tower_in_the_dtype(tmp_path):
    quant = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    _write(tmp_path, "config.json", _vlm(torch_dtype="float16", quantization_config=quant))
    spec = get_model(str(tmp_path))
    unquantized = get_model(str(_copy(tmp_path, _vlm(torch_dtype="float16"))))
    vision = 32 * (4 * 1280**2 + 2 * 1280 * 4 * 1280)
    assert spec.quantization == "awq" and spec.parameters == unquantized.parameters
    assert vision * 2 < spec.weight_bytes < unquantized.weights_bytes / 2
    assert spec.supports_pixel_budget and spec.factor == 28  # still the VLM recipe


def _copy(tmp_path, config):
    other = tmp_path / "plain"
    other.mkdir()
    _write(other, "config.json", config)
    return other
