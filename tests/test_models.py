"""Model registry: lookups, cited numbers, visual-token formulas, local checkpoints."""

from __future__ import annotations

import json
import math
from dataclasses import fields

import pytest
import yaml

from ocrserve.models import (
    BY_ARCHITECTURE,
    DEFAULT_MODEL,
    REGISTRY,
    ModelError,
    RegistryError,
    get_model,
    load_registry,
)
from ocrserve.models.schema import REGISTRY_DIR, RegistryEntry
from ocrserve.preprocess import geometry
from ocrserve.preprocess.geometry import smart_resize

NUMERIC_FIELDS = [f.name for f in fields(REGISTRY[DEFAULT_MODEL].__class__) if f.type in ("int", "int | None")]


def test_default_model_is_hunyuan():
    assert DEFAULT_MODEL == "tencent/HunyuanOCR"
    assert set(REGISTRY) == {
        "tencent/HunyuanOCR",
        "tencent/HunyuanOCR-1.5",
        "PaddlePaddle/PaddleOCR-VL",
        "deepseek-ai/DeepSeek-OCR",
        "rednote-hilab/dots.ocr",
        "allenai/olmOCR-2-7B-1025",
        "Qwen/Qwen2.5-VL-7B-Instruct",
        "Qwen/Qwen3-VL-8B-Instruct",
        "zai-org/GLM-OCR",
    }


@pytest.mark.parametrize(
    "name, expected",
    [
        ("tencent/HunyuanOCR", "tencent/HunyuanOCR"),
        ("TENCENT/hunyuanocr", "tencent/HunyuanOCR"),
        ("dots.ocr", "rednote-hilab/dots.ocr"),
        ("olmOCR-2-7B-1025", "allenai/olmOCR-2-7B-1025"),
    ],
)
def test_lookup(name, expected):
    assert get_model(name).id == expected


def test_unknown_model_lists_known_ones():
    with pytest.raises(ModelError) as err:
        get_model("acme/ocr-9000")
    assert "tencent/HunyuanOCR" in str(err.value) and "config.json" in str(err.value)


@pytest.mark.parametrize("spec", list(REGISTRY.values()), ids=list(REGISTRY))
def test_every_number_cites_a_source(spec):
    assert NUMERIC_FIELDS  # parameters, num_layers, num_kv_heads, head_dim, ..., min/max_pixels
    defaults = {f.name: f.default for f in fields(spec)}
    for name in NUMERIC_FIELDS + ["dtype", "token_formula", "prompts", "sampling", "vllm_flags", "min_vllm"]:
        if name in ("row_tokens", "image_tokens", "weight_bytes") and getattr(spec, name) == defaults[name]:
            continue  # formula parameters an entry leaves at 0 are not in its file; weight_bytes 0 = computed
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
    assert get_model("zai-org/GLM-OCR").kv_bytes_per_token() == 2 * 16 * 8 * 128 * 2 == 65_536


def test_required_vllm_flags():
    assert "--trust-remote-code" in get_model("PaddlePaddle/PaddleOCR-VL").vllm_flags
    assert "--trust-remote-code" in get_model("dots.ocr").vllm_flags
    deepseek = get_model("deepseek-ai/DeepSeek-OCR")
    i = deepseek.vllm_flags.index("--logits-processors")
    assert deepseek.vllm_flags[i + 1] == "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor"
    assert deepseek.sampling["vllm_xargs"] == {
        "ngram_size": 30,
        "window_size": 90,
        "whitelist_token_ids": [128821, 128822],
    }
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


def _glm4v_tokens(height, width, max_pixels, factor=28, temporal=2):
    # transformers glm4v/image_processing_glm4v.py smart_resize for a still image (t = temporal_patch_size),
    # then vLLM glm4_1v.py _get_vision_info: grid_h * grid_w / merge^2
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if temporal * h * w > max_pixels:
        beta = math.sqrt(temporal * height * width / max_pixels)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    return (h // factor) * (w // factor)


def test_glm_ocr_entry_and_its_pixel_budget():
    glm = get_model("zai-org/GLM-OCR")
    assert (glm.architecture, glm.num_layers, glm.num_kv_heads, glm.head_dim, glm.factor) == ("glm_ocr", 16, 8, 128, 28)
    assert (glm.min_pixels, glm.max_pixels) == (112 * 112, 14 * 14 * 2 * 2 * 2 * 6144)  # preprocessor_config.json
    assert glm.prompts["text"] == "Text Recognition:" and glm.prompts["table"] == "Table Recognition:"
    assert glm.speculative["method"] == "mtp" and glm.speculative["num_speculative_tokens"] == 1
    # the MTP block: one decoder layer (q 1536x2048, k/v 1536x1024, o 2048x1536, MLP 3x1536x4608, 4 norms)
    # + eh_proj 2*1536 x 1536 + 3 norms; embedding and lm_head shared with the target
    layer = 1536 * 2048 * 2 + 1536 * 1024 * 2 + 3 * 1536 * 4608 + 4 * 1536
    assert glm.speculative["parameters"] == layer + 2 * 1536 * 1536 + 3 * 1536 == 35_400_192
    assert glm.speculative["kv_layers"] == 1 and glm.speculative.get("model") is None
    # GLM-4V counts t=2 frames against max_pixels: vLLM's largest page is 6,144 tokens, ocrserve reserves twice
    # that; for every page ocrserve's count is at least vLLM's (the over-estimate is on the safe side)
    assert _glm4v_tokens(9999, 9999, glm.max_pixels) <= 6144 < glm.max_visual_tokens() == 12288
    for h, w in [(3508, 2480), (2480, 3508), (1288, 1288), (8192, 512), (1000, 700)]:
        rh, rw = smart_resize(h, w, glm.factor, glm.min_pixels, glm.max_pixels)
        assert glm.visual_tokens(rh, rw) >= _glm4v_tokens(rh, rw, glm.max_pixels)


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
    _write(
        tmp_path,
        "config.json",
        {
            "model_type": "qwen2_5_vl",
            "torch_dtype": "bfloat16",
            "hidden_size": 1536,
            "intermediate_size": 8960,
            "num_hidden_layers": 28,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "vision_config": {
                "depth": 32,
                "hidden_size": 1280,
                "intermediate_size": 3420,
                "patch_size": 14,
                "spatial_merge_size": 2,
            },
        },
    )
    _write(tmp_path, "model.safetensors.index.json", {"metadata": {"total_size": 7_000_000_000}, "weight_map": {}})
    _write(tmp_path, "preprocessor_config.json", {"min_pixels": 3136, "max_pixels": 1_003_520})
    spec = get_model(str(tmp_path))
    assert spec.id == str(tmp_path)
    assert spec.parameters == 7_000_000_000 // 2 == 3_500_000_000  # total_size bytes / 2 (bf16)
    assert spec.weight_bytes == spec.weights_bytes == 7_000_000_000 and spec.quantization == ""
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (28, 2, 1536 // 12)
    assert spec.kv_bytes_per_token() == 2 * 28 * 2 * 128 * 2 == 28_672
    assert (spec.min_pixels, spec.max_pixels, spec.factor) == (3136, 1_003_520, 28)
    assert spec.prompts == REGISTRY["Qwen/Qwen2.5-VL-7B-Instruct"].prompts  # recipe from the family entry
    assert str(tmp_path / "config.json") in spec.sources["num_kv_heads"]
    assert "total_size" in spec.sources["parameters"]


def test_local_checkpoint_nested_text_config_without_weights(tmp_path):
    text = {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 262144,
        "dtype": "bfloat16",
    }
    vision = {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "patch_size": 16, "spatial_merge_size": 2}
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
    _write(tmp_path, "config.json", {"model_type": "qwen3_moe", "hidden_size": 8})
    with pytest.raises(ModelError) as err:
        get_model(str(tmp_path))
    # checked before any size: the message is about the model_type, listing VLMs and plain decoders
    assert "'qwen3_moe' is not supported" in str(err.value)
    assert "qwen2_5_vl" in str(err.value) and "llama" in str(err.value)


def test_local_checkpoint_missing_field(tmp_path):
    _write(tmp_path, "config.json", {"model_type": "qwen2_5_vl", "hidden_size": 8, "num_attention_heads": 2})
    with pytest.raises(ModelError, match="num_hidden_layers"):
        get_model(str(tmp_path))


# ---------------------------------------------------------------------------------------------
# Registry data files
# ---------------------------------------------------------------------------------------------


def _registry_copy(tmp_path):
    folder = tmp_path / "registry"
    folder.mkdir()
    for file in REGISTRY_DIR.iterdir():
        if file.name.endswith(".yaml"):
            (folder / file.name).write_text(file.read_text(encoding="utf-8"), encoding="utf-8")
    return folder


def _edit(folder, name, change):
    path = folder / name
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def test_registry_files_load_and_validate():
    names = sorted(f.name for f in REGISTRY_DIR.iterdir() if f.name.endswith(".yaml"))
    assert len(names) == len(REGISTRY) == 9  # one file per entry, shipped as package data
    loaded = load_registry()
    assert list(loaded.specs) == list(REGISTRY)  # listing order from the files' `order`
    assert list(REGISTRY)[0] == DEFAULT_MODEL
    assert loaded.specs == REGISTRY
    for spec in REGISTRY.values():
        assert loaded.files[spec.id].endswith(".yaml")
    # every file that does not derive from another validates on its own
    for name in names:
        data = yaml.safe_load((REGISTRY_DIR / name).read_text(encoding="utf-8"))
        if "base" not in data:
            RegistryEntry.model_validate(data)
            assert data["parameters"].keys() == {"value", "source"}  # {value, source} per number


def test_olmocr_derives_from_qwen25_vl_without_repeating_numbers():
    raw = yaml.safe_load((REGISTRY_DIR / "olmocr-2-7b-1025.yaml").read_text(encoding="utf-8"))
    assert raw["base"] == "Qwen/Qwen2.5-VL-7B-Instruct"
    for key in ("num_layers", "num_kv_heads", "head_dim", "hidden_size", "patch_size", "vocab_size"):
        assert key not in raw  # inherited
    assert "value" not in raw["parameters"]  # same count, its own citation
    olm, qwen = get_model("olmOCR-2-7B-1025"), get_model("Qwen/Qwen2.5-VL-7B-Instruct")
    for f in (
        "parameters",
        "num_layers",
        "num_kv_heads",
        "head_dim",
        "hidden_size",
        "intermediate_size",
        "vision_hidden_size",
        "patch_size",
        "merge_size",
        "min_pixels",
        "architecture",
    ):
        assert getattr(olm, f) == getattr(qwen, f)
    assert olm.max_pixels == 1288 * 1288 and not olm.image_first
    assert "olmOCR-2-7B-1025" in olm.sources["parameters"]  # the derived entry's citation
    assert olm.sources["num_layers"] == qwen.sources["num_layers"]  # inherited citation
    assert BY_ARCHITECTURE["qwen2_5_vl"] is qwen  # template_for is not inherited


@pytest.mark.parametrize(
    "name, change, expected",
    [
        ("hunyuanocr.yaml", lambda d: d["parameters"].update(value="about 1B"), "parameters.value"),
        ("hunyuanocr.yaml", lambda d: d["patch_size"].pop("source"), "patch_size.source"),
        ("hunyuanocr.yaml", lambda d: d["head_dim"].update(source="  "), "head_dim.source"),
        ("hunyuanocr.yaml", lambda d: d.update(num_layers=24), "num_layers"),  # a bare number, no source
        ("hunyuanocr.yaml", lambda d: d.update(colour={"value": 1, "source": "x"}), "colour"),
        ("hunyuanocr.yaml", lambda d: d["prompts"]["value"].pop("table"), "prompts"),
        ("hunyuanocr.yaml", lambda d: d["sampling"]["value"].pop("max_tokens"), "max_tokens"),
        ("hunyuanocr.yaml", lambda d: d["dtype"].update(value="int3"), "dtype.value"),
        ("paddleocr-vl.yaml", lambda d: d["min_pixels"].update(value=10**9), "min_pixels"),
        ("deepseek-ocr.yaml", lambda d: d.pop("tiles"), "tiles"),
        ("olmocr-2-7b-1025.yaml", lambda d: d.update(base="acme/nothing"), "base"),
        ("olmocr-2-7b-1025.yaml", lambda d: d["max_pixels"].pop("source"), "max_pixels.source"),
        ("olmocr-2-7b-1025.yaml", lambda d: d.update(template_for=["qwen2_5_vl"]), "template_for"),
        ("qwen3-vl-8b-instruct.yaml", lambda d: d.update(id="tencent/HunyuanOCR"), "id"),
    ],
)
def test_broken_entry_names_its_file_and_key(tmp_path, name, change, expected):
    folder = _registry_copy(tmp_path)
    path = _edit(folder, name, change)
    with pytest.raises(RegistryError) as err:
        load_registry(folder)
    message = str(err.value)
    assert isinstance(err.value, ModelError)
    assert str(path) in message and expected in message, message


def test_invalid_yaml_names_its_file(tmp_path):
    folder = _registry_copy(tmp_path)
    (folder / "dots.ocr.yaml").write_text("id: rednote-hilab/dots.ocr\nparameters: {value: 3\n", encoding="utf-8")
    with pytest.raises(RegistryError, match=r"dots\.ocr\.yaml: not valid YAML"):
        load_registry(folder)


# ---------------------------------------------------------------------------------------------
# One geometry: the same numbers as the registry's own formulas gave before the move
# ---------------------------------------------------------------------------------------------

# Computed with the pre-refactor code (ModelSpec.visual_tokens after smart_resize for pages of
# (h, w) = A4 portrait and landscape at 300 dpi, 1288^2, 8192x512, 300x200; max_visual_tokens at the
# model's budget, at [512^2, 2048^2] and at [3136, 1e6]).
BEFORE = [
    ("tencent/HunyuanOCR", (8692, 8660, 1642, 4354, 302), 16514, 4354, 1002),
    ("tencent/HunyuanOCR-1.5", (8692, 8660, 1642, 4354, 302), 16514, 4354, 1002),  # 1.0's backbone
    ("PaddlePaddle/PaddleOCR-VL", (3550, 3550, 2116, 3346, 204), 3600, 5349, 1275),
    ("deepseek-ai/DeepSeek-OCR", (903, 893, 693, 933, 273), 933, None, None),
    ("rednote-hilab/dots.ocr", (11125, 11125, 2116, 5274, 77), 14400, 5349, 1275),
    ("allenai/olmOCR-2-7B-1025", (2052, 2052, 2116, 2024, 77), 2116, 5349, 1275),
    ("Qwen/Qwen2.5-VL-7B-Instruct", (11125, 11125, 2116, 5274, 77), 16384, 5349, 1275),
    ("Qwen/Qwen3-VL-8B-Instruct", (8580, 8580, 1600, 4096, 70), 16384, 4096, 976),
    ("zai-org/GLM-OCR", (11125, 11125, 2116, 5274, 77), 12288, 5349, 1275),  # factor 28, as Qwen2.5-VL
]
PAGES = [(3508, 2480), (2480, 3508), (1288, 1288), (8192, 512), (300, 200)]


def test_before_numbers_cover_the_registry():
    assert [row[0] for row in BEFORE] == list(REGISTRY)


@pytest.mark.parametrize("model_id, tokens, at_default, at_2048, at_1mp", BEFORE, ids=[r[0] for r in BEFORE])
def test_one_formula_gives_the_numbers_of_before(model_id, tokens, at_default, at_2048, at_1mp):
    spec = get_model(model_id)
    got = []
    for h, w in PAGES:
        if spec.supports_pixel_budget:
            h, w = smart_resize(h, w, spec.factor, spec.min_pixels, spec.max_pixels)
            # the preprocessor's function, given the spec's parameters, is the spec's formula
            assert geometry.visual_tokens(
                h, w, spec.factor, row_tokens=spec.row_tokens, image_tokens=spec.image_tokens
            ) == spec.visual_tokens(h, w)
        got.append(spec.visual_tokens(h, w))
    assert tuple(got) == tokens
    assert spec.max_visual_tokens() == at_default
    if spec.supports_pixel_budget:
        assert spec.max_visual_tokens(512 * 512, 2048 * 2048) == at_2048
        assert spec.max_visual_tokens(3136, 1_000_000) == at_1mp
