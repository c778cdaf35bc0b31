"""Model registry: lookups, cited numbers, visual-token formulas, local checkpoints."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from ocrserve.models import DEFAULT_MODEL, REGISTRY, ModelError, get_model, smart_resize

NUMERIC_FIELDS = [f.name for f in fields(REGISTRY[DEFAULT_MODEL].__class__) if f.type in ("int", "int | None")]


def test_default_model_is_hunyuan():
    assert DEFAULT_MODEL == "tencent/HunyuanOCR"
    assert set(REGISTRY) == {
        "tencent/HunyuanOCR", "PaddlePaddle/PaddleOCR-VL", "deepseek-ai/DeepSeek-OCR", "rednote-hilab/dots.ocr",
        "allenai/olmOCR-2-7B-1025", "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen3-VL-8B-Instruct",
    }


@pytest.mark.parametrize("name, expected", [
    ("tencent/HunyuanOCR", "tencent/HunyuanOCR"),
    ("TENCENT/hunyuanocr", "tencent/HunyuanOCR"),
    ("dots.ocr", "rednote-hilab/dots.ocr"),
    ("olmOCR-2-7B-1025", "allenai/olmOCR-2-7B-1025"),
])
def test_lookup(name, expected):
    assert get_model(name).id == expected


def test_unknown_model_lists_known_ones():
    with pytest.raises(ModelError) as err:
        get_model("acme/ocr-9000")
    assert "tencent/HunyuanOCR" in str(err.value) and "config.json" in str(err.value)


@pytest.mark.parametrize("spec", list(REGISTRY.values()), ids=list(REGISTRY))
def test_every_number_cites_a_source(spec):
    assert NUMERIC_FIELDS  # parameters, num_layers, num_kv_heads, head_dim, ..., min/max_pixels
    for name in NUMERIC_FIELDS + ["dtype", "token_formula", "prompts", "sampling", "vllm_flags", "min_vllm"]:
        assert spec.sources.get(name, "").strip(), f"{spec.id}: {name} has no source"


@pytest.mark.parametrize("spec", list(REGISTRY.values()), ids=list(REGISTRY))
def test_recipes_are_complete(spec):
    assert set(spec.prompts) == {"text", "markdown", "table"}
    assert spec.max_tokens > 0  # max_tokens is always set
    assert "--no-enable-prefix-caching" in spec.vllm_flags  # single-use pages: no prefix/mm caching
    assert spec.factor == spec.patch_size * spec.merge_size


def test_kv_bytes_per_token():
    # 2 (K,V) x layers x kv_heads x head_dim x 2 bytes (bf16)
    assert get_model("tencent/HunyuanOCR").kv_bytes_per_token() == 2 * 24 * 8 * 128 * 2 == 98_304
    assert get_model("allenai/olmOCR-2-7B-1025").kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2 == 57_344
    assert get_model("PaddlePaddle/PaddleOCR-VL").kv_bytes_per_token() == 2 * 18 * 2 * 128 * 2 == 18_432
    assert get_model("Qwen/Qwen3-VL-8B-Instruct").kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2 == 147_456


def test_required_vllm_flags():
    assert "--trust-remote-code" in get_model("PaddlePaddle/PaddleOCR-VL").vllm_flags
    assert "--trust-remote-code" in get_model("dots.ocr").vllm_flags
    deepseek = get_model("deepseek-ai/DeepSeek-OCR")
    i = deepseek.vllm_flags.index("--logits-processors")
    assert deepseek.vllm_flags[i + 1] == "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor"
    assert deepseek.sampling["vllm_xargs"] == {"ngram_size": 30, "window_size": 90,
                                               "whitelist_token_ids": [128821, 128822]}
    assert get_model("tencent/HunyuanOCR").sampling["repetition_penalty"] == 1.08


def test_smart_resize_a4_page():
    # 2480 x 3508 px (A4 at 300 dpi) into 1,003,520 px with factor 28:
    # round(3508/28)*28 = 3500, round(2480/28)*28 = 2492; 3500*2492 > 1,003,520, so
    # beta = sqrt(3508*2480 / 1,003,520) = 2.9444; floor(3508/2.9444/28)*28 = 42*28 = 1176,
    # floor(2480/2.9444/28)*28 = 30*28 = 840.
    assert smart_resize(3508, 2480, 28, 3136, 1_003_520) == (1176, 840)
    # a tiny image grows to min_pixels: 56x56 = 3136
    assert smart_resize(20, 20, 28, 3136, 1_003_520) == (56, 56)


def test_visual_tokens_grid():
    olm = get_model("allenai/olmOCR-2-7B-1025")
    # 1288 / 28 = 46 tokens per side; 46 * 46 = 2116
    assert olm.visual_tokens(1288, 1288) == 2116
    assert olm.max_visual_tokens() == 1288 * 1288 // 28**2 == 2116
    paddle = get_model("PaddlePaddle/PaddleOCR-VL")
    assert paddle.max_visual_tokens() == 2_822_400 // 784 == 3600  # 1680^2 / 28^2 = 60^2


def test_visual_tokens_hunyuan_newline_formula():
    hy = get_model("tencent/HunyuanOCR")
    # (h/32) * (w/32 + 1) + 2: 64 rows of 64 tokens plus a newline each, plus begin/end
    assert hy.visual_tokens(2048, 2048) == 64 * 65 + 2 == 4162
    # vLLM profiles with a 512 x 8192 image: 256 rows of 16 tokens + newline: 256*17 + 2 = 4354 > 4162
    assert hy.max_visual_tokens(512 * 512, 2048 * 2048) == 4354
    # at the model default 4096^2 the square page wins: 128 * 129 + 2
    assert hy.max_visual_tokens() == 128 * 129 + 2 == 16514


def test_visual_tokens_deepseek_tiles():
    ds = get_model("deepseek-ai/DeepSeek-OCR")
    # global 1024 view: (16 + 1) * 16 + 1 = 273 tokens; a page <= 640 px gets no tiles
    assert ds.visual_tokens(400, 600) == 273
    # A4 portrait (aspect 0.707) -> closest grid 2 cols x 3 rows: (10*2 + 1) * (10*3) = 630 more
    assert ds.visual_tokens(3508, 2480) == 273 + 630
    # worst grid 1 x 6: (10*1 + 1) * 60 = 660
    assert ds.max_visual_tokens() == 273 + 660 == 933
    assert not ds.supports_pixel_budget


def test_prompt_tokens_estimate():
    # 'Table Recognition:' is the longest PaddleOCR-VL prompt: 18 bytes -> ceil(18/2) = 9, + 32 template
    assert get_model("PaddlePaddle/PaddleOCR-VL").prompt_tokens() == 9 + 32
    # HunyuanOCR doc_parse prompt: 209 UTF-8 bytes -> 105 + 32
    assert get_model("tencent/HunyuanOCR").prompt_tokens() == 105 + 32


def _write(folder, name, data):
    (folder / name).write_text(json.dumps(data))


def test_local_checkpoint_from_config_json(tmp_path):
    _write(tmp_path, "config.json", {
        "model_type": "qwen2_5_vl", "torch_dtype": "bfloat16", "hidden_size": 1536, "intermediate_size": 8960,
        "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "patch_size": 14,
                          "spatial_merge_size": 2},
    })
    _write(tmp_path, "model.safetensors.index.json", {"metadata": {"total_size": 7_000_000_000}, "weight_map": {}})
    _write(tmp_path, "preprocessor_config.json", {"min_pixels": 3136, "max_pixels": 1_003_520})
    spec = get_model(str(tmp_path))
    assert spec.id == str(tmp_path)
    assert spec.parameters == 7_000_000_000 // 2 == 3_500_000_000  # total_size bytes / 2 (bf16)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (28, 2, 1536 // 12)
    assert spec.kv_bytes_per_token() == 2 * 28 * 2 * 128 * 2 == 28_672
    assert (spec.min_pixels, spec.max_pixels, spec.factor) == (3136, 1_003_520, 28)
    assert spec.prompts == REGISTRY["Qwen/Qwen2.5-VL-7B-Instruct"].prompts  # recipe from the family entry
    assert str(tmp_path / "config.json") in spec.sources["num_kv_heads"]
    assert "total_size" in spec.sources["parameters"]


def test_local_checkpoint_nested_text_config_without_weights(tmp_path):
    text = {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True,
            "max_position_embeddings": 262144, "dtype": "bfloat16"}
    vision = {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "patch_size": 16,
              "spatial_merge_size": 2}
    _write(tmp_path, "config.json", {"model_type": "qwen3_vl", "text_config": text, "vision_config": vision})
    spec = get_model(str(tmp_path))
    # embeddings 151936*2048 (tied) + 28 layers * (2*2048*16*128 + 2*2048*8*128 + 3*2048*6144)
    # + 24 vision blocks * (4*1024^2 + 2*1024*4096)
    layer = 2 * 2048 * 16 * 128 + 2 * 2048 * 8 * 128 + 3 * 2048 * 6144
    expected = 151936 * 2048 + 28 * layer + 24 * (4 * 1024**2 + 2 * 1024 * 4096)
    assert spec.parameters == expected
    assert spec.kv_bytes_per_token() == 2 * 28 * 8 * 128 * 2
    assert spec.factor == 32 and spec.max_pixels == REGISTRY["Qwen/Qwen3-VL-8B-Instruct"].max_pixels
    assert "estimated" in spec.sources["parameters"]


def test_local_checkpoint_unsupported_architecture(tmp_path):
    _write(tmp_path, "config.json", {"model_type": "llama", "hidden_size": 8})
    with pytest.raises(ModelError) as err:
        get_model(str(tmp_path))
    assert "llama" in str(err.value) and "qwen2_5_vl" in str(err.value)


def test_local_checkpoint_missing_field(tmp_path):
    _write(tmp_path, "config.json", {"model_type": "qwen2_5_vl", "hidden_size": 8, "num_attention_heads": 2})
    with pytest.raises(ModelError, match="num_hidden_layers"):
        get_model(str(tmp_path))
