"""OCR model registry: the numbers the memory planner needs and the request recipe for each model.

Each :class:`ModelSpec` carries

* the memory facts: parameter count, dtype, decoder layers, KV heads, head dim (KV-cache bytes per
  token), hidden/intermediate sizes (activation estimate), vision-encoder sizes;
* the vision facts: patch size x merge size (the *factor* both page sides are rounded to), the
  model card's pixel bounds and the visual-token formula;
* the request recipe: prompts per task (``text``, ``markdown``, ``table``), sampling (greedy,
  ``max_tokens`` always set, the repetition guards the model card asks for) and the post-processing
  the card applies;
* the serving facts: ``vllm serve`` flags the model card or vLLM recipe requires and the lowest vLLM
  release that serves the model.

Every number cites its source in :attr:`ModelSpec.sources` (model card, ``config.json``,
``preprocessor_config.json``, vLLM source or recipe); where a number is an estimate the source says
so and explains it. A local checkpoint folder (one with ``config.json``) becomes a spec through
:func:`from_local`, which reads the numbers from its own files and takes the recipe from the
registry entry of the same architecture.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
CHAT_TEMPLATE_TOKENS = 32
"""Tokens the chat template wraps around one user turn with one image (role markers, image start/end
markers, generation prompt). Estimate: Qwen2-VL's template adds 17 tokens around an image and a text
(``<|im_start|>user\\n<|vision_start|>``...``<|im_end|>\\n<|im_start|>assistant\\n``); 32 leaves
room for templates with a system turn (HunyuanOCR sends an empty one)."""

GRID = "grid"
GRID_NEWLINE = "grid_newline"
TILES = "tiles"


class ModelError(LookupError):
    """An unknown model id, or a local folder that cannot be read as a supported model."""


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Resize ``(height, width)`` the way Qwen2-VL-style processors do (and ocrserve's preprocessor).

    Both sides become multiples of ``factor``, the area lands in ``[min_pixels, max_pixels]`` and the
    aspect ratio is kept as closely as possible. Source: ``smart_resize`` in transformers'
    ``image_processing_qwen2_vl.py`` and vLLM's ``hunyuan_vl_image.py`` (identical arithmetic).

    Returns:
        ``(resized_height, resized_width)`` in pixels.
    """
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ModelSpec:
    """One OCR model as the planner and the vLLM engine see it.

    Sizes are per model (not per GPU). ``min_pixels``/``max_pixels`` are ``None`` for models whose
    processor tiles pages itself (DeepSeek-OCR); their pixel budget is not a vLLM knob.

    Attributes:
        id: Hugging Face id (or the local folder path).
        architecture: ``config.json`` ``model_type`` family this spec follows.
        parameters: total parameters, language model plus vision encoder.
        dtype: checkpoint dtype vLLM loads by default (``--dtype auto``).
        num_layers: decoder layers (each keeps K and V per token).
        num_attention_heads: query heads per layer (tensor parallelism must divide them).
        num_kv_heads: key/value heads per layer (grouped-query attention).
        head_dim: dimension of one attention head.
        hidden_size: decoder hidden size.
        intermediate_size: decoder MLP intermediate size (dense layers).
        vocab_size: vocabulary size (the sampler holds ``max_num_seqs x vocab`` fp32 logits).
        max_position_embeddings: the longest sequence the decoder supports (caps ``--max-model-len``).
        vision_hidden_size: vision-encoder hidden size.
        vision_intermediate_size: vision-encoder MLP intermediate size.
        patch_size: vision patch side, px.
        merge_size: patches merged per side into one visual token.
        min_pixels: the processor's lower pixel bound (``None`` for tiling models).
        max_pixels: the processor's upper pixel bound (``None`` for tiling models).
        token_formula: ``"grid"`` (h/f * w/f), ``"grid_newline"`` (HunyuanOCR: a newline token per
            row plus begin/end) or ``"tiles"`` (DeepSeek-OCR Gundam tiling).
        prompts: instruction per task: ``text`` (plain text), ``markdown``, ``table``.
        prompt_prefix: text the engine puts before the instruction in the same user turn.
        system_prompt: system turn content, ``None`` for no system turn.
        image_first: whether the image part precedes the text part in the user turn.
        sampling: OpenAI chat-completions parameters (vLLM spelling; ``max_tokens`` always set).
        postprocess: name of the output clean-up the model card applies (``""`` for none).
        vllm_flags: ``vllm serve`` flags the model needs beyond the planned ones.
        min_vllm: lowest vLLM release that serves the model.
        sources: field name -> where its value comes from.
        notes: anything an operator should know.
    """

    id: str
    architecture: str
    parameters: int
    dtype: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    vision_hidden_size: int
    vision_intermediate_size: int
    patch_size: int
    merge_size: int
    min_pixels: int | None
    max_pixels: int | None
    token_formula: str
    prompts: Mapping[str, str]
    sampling: Mapping[str, object]
    vllm_flags: tuple[str, ...]
    min_vllm: str
    sources: Mapping[str, str]
    prompt_prefix: str = ""
    system_prompt: str | None = None
    image_first: bool = True
    postprocess: str = ""
    notes: str = ""
    tiles: Mapping[str, int] = field(default_factory=dict)

    @property
    def factor(self) -> int:
        """Page sides are rounded to multiples of this, px (patch size x merge size)."""
        return self.patch_size * self.merge_size

    @property
    def dtype_bytes(self) -> int:
        """Bytes per weight/activation element in :attr:`dtype`."""
        return DTYPE_BYTES[self.dtype]

    @property
    def max_tokens(self) -> int:
        """The output-token budget per page the recipe sets."""
        return int(self.sampling["max_tokens"])

    @property
    def supports_pixel_budget(self) -> bool:
        """Whether vLLM takes ``min_pixels``/``max_pixels`` through ``--mm-processor-kwargs``."""
        return self.token_formula != TILES

    def kv_bytes_per_token(self, dtype_bytes: int | None = None) -> int:
        """KV-cache bytes one token occupies: ``2 * layers * kv_heads * head_dim * dtype_bytes``.

        The 2 is one K and one V vector per layer and KV head (PagedAttention, Kwon et al., SOSP
        2023, section 3: "2 (key and value vectors) x 5120 (hidden state size) x 40 (number of
        layers) x 2 (bytes per FP16)" for OPT-13B; vLLM's ``AttentionSpec.page_size_bytes`` =
        ``2 * block_size * num_kv_heads * head_size * dtype_size``).
        """
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * (dtype_bytes or self.dtype_bytes)

    def prompt_tokens(self) -> int:
        """Upper estimate of the text tokens of the longest task prompt, template included.

        BPE vocabularies of these models spend at least ~2 UTF-8 bytes per token on English and
        Chinese text (English averages ~4 characters per token; a CJK character is 3 bytes and
        rarely less than one token), so ``ceil(bytes / 2)`` over-counts; plus
        :data:`CHAT_TEMPLATE_TOKENS` for the chat template.
        """
        texts = [self.prompt_prefix + p for p in self.prompts.values()]
        if self.system_prompt:
            texts = [t + self.system_prompt for t in texts]
        longest = max(len(t.encode("utf-8")) for t in texts)
        return math.ceil(longest / 2) + CHAT_TEMPLATE_TOKENS

    def visual_tokens(self, height: int, width: int) -> int:
        """Visual tokens for an image already resized to ``height x width`` px.

        ``grid``: ``(h / f) * (w / f)`` (Qwen2-VL family: one token per ``merge x merge`` patches).
        ``grid_newline``: ``(h / f) * (w / f + 1) + 2`` (vLLM ``hunyuan_vision.py``
        ``_get_vision_info``: a newline token per row plus image begin/end).
        ``tiles``: DeepSeek-OCR Gundam mode, see :meth:`_tile_tokens`.
        """
        f = self.factor
        if self.token_formula == GRID:
            return (height // f) * (width // f)
        if self.token_formula == GRID_NEWLINE:
            return (height // f) * (width // f + 1) + 2
        return self._tile_tokens(height, width)

    def _tile_tokens(self, height: int, width: int) -> int:
        """DeepSeek-OCR (vLLM ``processors/deepseek_ocr.py`` ``tokenize_with_images``).

        Global 1024 px view: ``(q_base + 1) * q_base + 1`` tokens with ``q_base = 1024/16/4 = 16``;
        plus, when the page exceeds 640 px, local 640 px tiles ``(cols, rows)`` with
        ``cols * rows <= 6``: ``(q * cols + 1) * (q * rows)`` with ``q = 640/16/4 = 10``.
        """
        t = self.tiles
        q_base, q = t["base_queries"], t["tile_queries"]
        tokens = (q_base + 1) * q_base + 1
        if height <= t["tile_size"] and width <= t["tile_size"]:
            return tokens
        cols, rows = _closest_tiling(width / height, t["min_crops"], t["max_crops"])
        return tokens + (q * cols + 1) * (q * rows)

    def max_visual_tokens(self, min_pixels: int | None = None, max_pixels: int | None = None) -> int:
        """The most visual tokens one page can cost under the pixel budget.

        ``grid``: ``max_pixels // f**2``; smart_resize never exceeds ``max_pixels``, so this bounds
        every aspect ratio. ``grid_newline``: the larger of a square page at ``max_pixels`` and the
        512 x 8192 px image vLLM itself profiles with at start-up (``hunyuan_vision.py``
        ``get_image_size_with_most_features``), so the planned batch-token floor is never below
        vLLM's own. ``tiles``: the worst tiling, 1 x 6 tiles (933 tokens).
        """
        lo = min_pixels if min_pixels is not None else self.min_pixels
        hi = max_pixels if max_pixels is not None else self.max_pixels
        f = self.factor
        if self.token_formula == GRID:
            return hi // (f * f)
        if self.token_formula == GRID_NEWLINE:
            square = smart_resize(100_000, 100_000, f, lo, hi)
            tall = smart_resize(8192, 512, f, lo, hi)
            return max(self.visual_tokens(*square), self.visual_tokens(*tall))
        t = self.tiles
        q_base, q = t["base_queries"], t["tile_queries"]
        worst_local = max((q * c + 1) * (q * r) for c, r in _tilings(t["min_crops"], t["max_crops"]))
        return (q_base + 1) * q_base + 1 + worst_local

    def with_overrides(self, **changes) -> ModelSpec:
        """A copy with some fields replaced (for tests and local checkpoints)."""
        return replace(self, **changes)


def _tilings(min_crops: int, max_crops: int) -> list[tuple[int, int]]:
    """``(cols, rows)`` grids DeepSeek-OCR may pick (vLLM ``calculate_aspect_ratios``)."""
    return sorted(
        {(i, j) for n in range(min_crops, max_crops + 1) for i in range(1, n + 1) for j in range(1, n + 1)
         if min_crops <= i * j <= max_crops},
        key=lambda r: r[0] * r[1],
    )


def _closest_tiling(aspect: float, min_crops: int, max_crops: int) -> tuple[int, int]:
    best, best_diff = (1, 1), float("inf")
    for cols, rows in _tilings(min_crops, max_crops):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
    return best


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

HF = "https://huggingface.co/"
VLLM_GH = "https://github.com/vllm-project/vllm/blob/main/"
RECIPES = "https://github.com/vllm-project/recipes/blob/main/"
NO_CACHE_FLAGS = ("--no-enable-prefix-caching", "--mm-processor-cache-gb", "0")

_HUNYUAN_DOC = ("提取文档图片中正文的所有信息用markdown格式表示，其中页眉、页脚部分忽略，表格用html格式表达，"
                "文档中公式用latex格式表示，按照阅读顺序组织进行解析。")
HUNYUAN_OCR = ModelSpec(
    id="tencent/HunyuanOCR",
    architecture="hunyuan_vl",
    parameters=996_208_112,
    dtype="bfloat16",
    num_layers=24,
    num_attention_heads=16,
    num_kv_heads=8,
    head_dim=128,
    hidden_size=1024,
    intermediate_size=3584,
    vocab_size=120818,
    max_position_embeddings=131072,
    vision_hidden_size=1152,
    vision_intermediate_size=4304,
    patch_size=16,
    merge_size=2,
    min_pixels=512 * 512,
    max_pixels=4096 * 4096,
    token_formula=GRID_NEWLINE,
    prompts={
        "text": "提取图中的文字。",
        "markdown": _HUNYUAN_DOC,
        "table": "把图中的表格解析为HTML。",
    },
    system_prompt="",
    sampling={"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.08,
              "max_tokens": 16384, "skip_special_tokens": True},
    postprocess="clean_repeated_substrings",
    vllm_flags=NO_CACHE_FLAGS,
    min_vllm="0.18.1",
    sources={
        "parameters": HF + "tencent/HunyuanOCR (model card: 'lightweight 1B parameter design'); exact count: "
                      "transformers 5.20 HunYuanVLForConditionalGeneration built from config.json on the meta "
                      "device = 996,208,112 (decoder 539M incl. tied embedding, ViT 457M)",
        "dtype": HF + "tencent/HunyuanOCR/blob/main/config.json (bfloat16; README loads dtype=torch.bfloat16)",
        "num_layers": HF + "tencent/HunyuanOCR/blob/main/config.json text_config.num_hidden_layers=24",
        "num_attention_heads": HF + "tencent/HunyuanOCR/blob/main/config.json text_config.num_attention_heads=16",
        "num_kv_heads": HF + "tencent/HunyuanOCR/blob/main/config.json text_config.num_key_value_heads=8",
        "head_dim": HF + "tencent/HunyuanOCR/blob/main/config.json text_config.head_dim=128",
        "hidden_size": HF + "tencent/HunyuanOCR/blob/main/config.json text_config.hidden_size=1024",
        "intermediate_size": HF + "tencent/HunyuanOCR/blob/main/config.json text_config.intermediate_size=3584",
        "vocab_size": HF + "tencent/HunyuanOCR/blob/main/config.json text_config.vocab_size=120818",
        "max_position_embeddings": HF + "tencent/HunyuanOCR/blob/main/config.json "
                                   "text_config.max_position_embeddings=131072",
        "vision_hidden_size": HF + "tencent/HunyuanOCR/blob/main/config.json vision_config.hidden_size=1152",
        "vision_intermediate_size": HF + "tencent/HunyuanOCR/blob/main/config.json "
                                    "vision_config.intermediate_size=4304",
        "patch_size": HF + "tencent/HunyuanOCR/blob/main/config.json vision_config.patch_size=16",
        "merge_size": HF + "tencent/HunyuanOCR/blob/main/config.json vision_config.spatial_merge_size=2",
        "min_pixels": VLLM_GH + "vllm/transformers_utils/processors/hunyuan_vl_image.py "
                      "(size.shortest_edge default 512*512; config vision_config.min_image_size=512)",
        "max_pixels": "https://github.com/Tencent-Hunyuan/HunyuanOCR/blob/main/docs/inference/archive/vLLM.md "
                      "('Image resolution uses the model default (max_pixels ~ 4096x4096)'); "
                      "config vision_config.img_max_token_num=16384 = (4096/32)^2",
        "token_formula": VLLM_GH + "vllm/model_executor/models/hunyuan_vision.py _get_vision_info: "
                         "grid_h/merge * (grid_w/merge + 1) + 2",
        "prompts": "https://github.com/Tencent-Hunyuan/HunyuanOCR/blob/main/inference/utils/tasks.py "
                   "(official task prompts structured_parse, doc_parse, table; prompts are locked per task)",
        "sampling": "https://github.com/Tencent-Hunyuan/HunyuanOCR/blob/main/docs/inference/archive/vLLM.md "
                    "('temperature=0.0, top_p=1.0, top_k=-1, repetition_penalty=1.08 ... do not change'); "
                    "max_tokens=16384 from the model card's vLLM example SamplingParams(temperature=0, "
                    "max_tokens=16384)",
        "postprocess": "https://github.com/Tencent-Hunyuan/HunyuanOCR/blob/main/inference/utils/output_utils.py "
                       "clean_repeated_substrings (tail-repetition clean-up against greedy degeneration)",
        "vllm_flags": RECIPES + "Tencent-Hunyuan/HunyuanOCR.md (vllm serve tencent/HunyuanOCR "
                      "--no-enable-prefix-caching --mm-processor-cache-gb 0)",
        "min_vllm": "https://github.com/Tencent-Hunyuan/HunyuanOCR/blob/main/docs/inference/archive/vLLM.md "
                    "('vLLM 0.18.1 (release) natively supports HunYuanVLForConditionalGeneration')",
    },
    notes="The repo root holds HunyuanOCR-1.5 since 2026-07 (1.0 under v1.0/); both share this decoder. "
          "Send an empty system turn, the image before the text.",
)

PADDLEOCR_VL = ModelSpec(
    id="PaddlePaddle/PaddleOCR-VL",
    architecture="paddleocr_vl",
    parameters=905_601_648,
    dtype="bfloat16",
    num_layers=18,
    num_attention_heads=16,
    num_kv_heads=2,
    head_dim=128,
    hidden_size=1024,
    intermediate_size=3072,
    vocab_size=103424,
    max_position_embeddings=131072,
    vision_hidden_size=1152,
    vision_intermediate_size=4304,
    patch_size=14,
    merge_size=2,
    min_pixels=147384,
    max_pixels=2822400,
    token_formula=GRID,
    prompts={"text": "OCR:", "markdown": "OCR:", "table": "Table Recognition:"},
    sampling={"temperature": 0.0, "max_tokens": 8192},
    vllm_flags=("--trust-remote-code", *NO_CACHE_FLAGS),
    min_vllm="0.11.1",
    sources={
        "parameters": HF + "PaddlePaddle/PaddleOCR-VL (model card: 'PaddleOCR-VL-0.9B', NaViT encoder + "
                      "ERNIE-4.5-0.3B); exact count: transformers 5.20 PaddleOCRVLForConditionalGeneration built "
                      "from config.json on the meta device = 905,601,648",
        "dtype": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/config.json (torch_dtype bfloat16)",
        "num_layers": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/config.json num_hidden_layers=18",
        "num_attention_heads": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/config.json num_attention_heads=16",
        "num_kv_heads": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/config.json num_key_value_heads=2",
        "head_dim": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/config.json head_dim=128",
        "hidden_size": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/config.json hidden_size=1024",
        "intermediate_size": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/config.json intermediate_size=3072",
        "vocab_size": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/config.json vocab_size=103424",
        "max_position_embeddings": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/config.json "
                                   "max_position_embeddings=131072",
        "vision_hidden_size": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/config.json vision_config.hidden_size=1152",
        "vision_intermediate_size": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/config.json "
                                    "vision_config.intermediate_size=4304",
        "patch_size": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/preprocessor_config.json patch_size=14",
        "merge_size": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/preprocessor_config.json merge_size=2",
        "min_pixels": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/preprocessor_config.json min_pixels=147384",
        "max_pixels": HF + "PaddlePaddle/PaddleOCR-VL/blob/main/preprocessor_config.json max_pixels=2822400",
        "token_formula": VLLM_GH + "vllm/model_executor/models/paddleocr_vl.py (Qwen2-VL-style grid: "
                         "grid_h*grid_w/merge^2)",
        "prompts": RECIPES + "PaddlePaddle/PaddleOCR-VL.md TASKS ('OCR:', 'Table Recognition:'); the model "
                   "has no separate markdown mode, 'OCR:' returns the element's text",
        "sampling": RECIPES + "PaddlePaddle/PaddleOCR-VL.md (temperature=0.0); max_tokens=8192 is PaddleX's "
                    "predictor default (paddlex/inference/models/doc_vlm/predictor.py max_new_tokens); "
                    "generation_config.json sets no repetition penalty",
        "vllm_flags": RECIPES + "PaddlePaddle/PaddleOCR-VL.md (--trust-remote-code --no-enable-prefix-caching "
                      "--mm-processor-cache-gb 0)",
        "min_vllm": RECIPES + "PaddlePaddle/PaddleOCR-VL.md ('Until v0.11.1 release, you need to install vLLM "
                    "from nightly build')",
    },
    notes="Trained on layout-cropped elements (PP-DocLayout crops); whole pages work but the official "
          "pipeline crops first.",
)

DEEPSEEK_OCR = ModelSpec(
    id="deepseek-ai/DeepSeek-OCR",
    architecture="deepseek_vl_v2",
    parameters=3_380_000_000,
    dtype="bfloat16",
    num_layers=12,
    num_attention_heads=10,
    num_kv_heads=10,
    head_dim=128,
    hidden_size=1280,
    intermediate_size=6848,
    vocab_size=129280,
    max_position_embeddings=8192,
    vision_hidden_size=1024,
    vision_intermediate_size=4096,
    patch_size=16,
    merge_size=4,
    min_pixels=None,
    max_pixels=None,
    token_formula=TILES,
    tiles={"base_queries": 16, "tile_queries": 10, "tile_size": 640, "min_crops": 2, "max_crops": 6},
    prompts={
        "text": "Free OCR.",
        "markdown": "<|grounding|>Convert the document to markdown.",
        "table": "Free OCR.",
    },
    image_first=True,
    sampling={"temperature": 0.0, "max_tokens": 7168, "skip_special_tokens": False,
              "vllm_xargs": {"ngram_size": 30, "window_size": 90, "whitelist_token_ids": [128821, 128822]}},
    vllm_flags=("--logits-processors", "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor",
                *NO_CACHE_FLAGS),
    min_vllm="0.11.1",
    sources={
        "parameters": "https://arxiv.org/abs/2510.18234 (DeepSeek-OCR report: DeepEncoder ~380M "
                      "(SAM-base 80M + CLIP-large 300M) + DeepSeek3B-MoE-A570M decoder => ~3.38B)",
        "dtype": HF + "deepseek-ai/DeepSeek-OCR/blob/main/config.json (torch_dtype bfloat16)",
        "num_layers": HF + "deepseek-ai/DeepSeek-OCR/blob/main/config.json language_config.num_hidden_layers=12",
        "num_attention_heads": HF + "deepseek-ai/DeepSeek-OCR/blob/main/config.json "
                               "language_config.num_attention_heads=10",
        "num_kv_heads": HF + "deepseek-ai/DeepSeek-OCR/blob/main/config.json language_config.num_key_value_heads"
                        "=10 (kv_lora_rank null: plain multi-head attention, no MLA)",
        "head_dim": HF + "deepseek-ai/DeepSeek-OCR/blob/main/config.json hidden_size 1280 / 10 heads = 128",
        "hidden_size": HF + "deepseek-ai/DeepSeek-OCR/blob/main/config.json language_config.hidden_size=1280",
        "intermediate_size": HF + "deepseek-ai/DeepSeek-OCR/blob/main/config.json language_config."
                             "intermediate_size=6848 (dense first layer; MoE layers use 6 of 64 experts x 896 "
                             "+ 2 shared)",
        "vocab_size": HF + "deepseek-ai/DeepSeek-OCR/blob/main/config.json language_config.vocab_size=129280",
        "max_position_embeddings": HF + "deepseek-ai/DeepSeek-OCR/blob/main/config.json language_config."
                                   "max_position_embeddings=8192",
        "vision_hidden_size": "https://arxiv.org/abs/2510.18234 (CLIP-large: hidden 1024, MLP 4096; the SAM-base "
                              "stage runs windowed attention on 4096 patches first)",
        "vision_intermediate_size": "https://arxiv.org/abs/2510.18234 (CLIP-large MLP 4096)",
        "patch_size": VLLM_GH + "vllm/transformers_utils/processors/deepseek_ocr.py patch_size=16",
        "merge_size": VLLM_GH + "vllm/transformers_utils/processors/deepseek_ocr.py downsample_ratio=4",
        "min_pixels": "not applicable: vLLM's processor tiles pages itself (Gundam mode, constants in "
                      "processors/deepseek_ocr.py, not exposed as mm kwargs)",
        "max_pixels": "not applicable: see min_pixels",
        "tiles": VLLM_GH + "vllm/transformers_utils/processors/deepseek_ocr.py (BASE_SIZE=1024, IMAGE_SIZE=640, "
                 "MIN_CROPS=2, MAX_CROPS=6; queries = ceil(size/16/4))",
        "token_formula": VLLM_GH + "vllm/transformers_utils/processors/deepseek_ocr.py tokenize_with_images",
        "prompts": RECIPES + "DeepSeek/DeepSeek-OCR.md (online serving sends the text 'Free OCR.'; the model "
                   "card's '<image>\\n<|grounding|>Convert the document to markdown.' minus the <image> tag, which "
                   "vLLM's chat template inserts); no table-specific prompt exists",
        "sampling": RECIPES + "DeepSeek/DeepSeek-OCR.md (temperature=0.0, skip_special_tokens=False, "
                    "max_tokens=8192 offline; ocrserve sends 7168 = 8192 max_position_embeddings minus one page's "
                    "<=1024 visual+prompt tokens, since vLLM rejects prompt + max_tokens > max_model_len; "
                    "vllm_xargs ngram_size=30 window_size=90 whitelist <td></td> "
                    "= 128821, 128822)",
        "vllm_flags": RECIPES + "DeepSeek/DeepSeek-OCR.md (--logits_processors vllm.model_executor.models."
                      "deepseek_ocr:NGramPerReqLogitsProcessor --no-enable-prefix-caching --mm-processor-cache-gb 0)",
        "min_vllm": RECIPES + "DeepSeek/DeepSeek-OCR.md ('Until v0.11.1 release, you need to install vLLM from "
                    "nightly build')",
    },
    notes="Page pixel budget is not a vLLM knob: pages are padded to a 1024 px global view plus up to 6 "
          "640 px tiles; the preprocessor's max_pixels only bounds the upload.",
)

_DOTS_TEXT = "Extract the text content from this image."
_DOTS_LAYOUT = (
    "Please output the layout information from the PDF image, including each layout element's bbox, its "
    "category, and the corresponding text content within the bbox.\n\n1. Bbox format: [x1, y1, x2, y2]\n\n"
    "2. Layout Categories: The possible categories are ['Caption', 'Footnote', 'Formula', 'List-item', "
    "'Page-footer', 'Page-header', 'Picture', 'Section-header', 'Table', 'Text', 'Title'].\n\n"
    "3. Text Extraction & Formatting Rules:\n    - Picture: For the 'Picture' category, the text field should "
    "be omitted.\n    - Formula: Format its text as LaTeX.\n    - Table: Format its text as HTML.\n    - All "
    "Others (Text, Title, etc.): Format their text as Markdown.\n\n4. Constraints:\n    - The output text must "
    "be the original text from the image, with no translation.\n    - All layout elements must be sorted "
    "according to human reading order.\n\n5. Final Output: The entire output must be a single JSON object."
)
DOTS_OCR = ModelSpec(
    id="rednote-hilab/dots.ocr",
    architecture="dots_ocr",
    parameters=3_000_000_000,
    dtype="bfloat16",
    num_layers=28,
    num_attention_heads=12,
    num_kv_heads=2,
    head_dim=128,
    hidden_size=1536,
    intermediate_size=8960,
    vocab_size=151936,
    max_position_embeddings=131072,
    vision_hidden_size=1536,
    vision_intermediate_size=4224,
    patch_size=14,
    merge_size=2,
    min_pixels=3136,
    max_pixels=11289600,
    token_formula=GRID,
    prompts={"text": _DOTS_TEXT, "markdown": _DOTS_LAYOUT, "table": _DOTS_TEXT},
    prompt_prefix="<|img|><|imgpad|><|endofimg|>",
    sampling={"temperature": 0.1, "top_p": 0.9, "max_tokens": 32768},
    vllm_flags=("--trust-remote-code", *NO_CACHE_FLAGS),
    min_vllm="0.11.0",
    sources={
        "parameters": HF + "rednote-hilab/dots.ocr (safetensors 'Model size 3B params'; config arithmetic: "
                      "1.78B Qwen2-style decoder incl. untied 151936x1536 embeddings + 1.21B 42-layer ViT)",
        "dtype": HF + "rednote-hilab/dots.ocr/blob/main/config.json torch_dtype bfloat16",
        "num_layers": HF + "rednote-hilab/dots.ocr/blob/main/config.json num_hidden_layers=28",
        "num_attention_heads": HF + "rednote-hilab/dots.ocr/blob/main/config.json num_attention_heads=12",
        "num_kv_heads": HF + "rednote-hilab/dots.ocr/blob/main/config.json num_key_value_heads=2",
        "head_dim": HF + "rednote-hilab/dots.ocr/blob/main/config.json hidden_size 1536 / 12 heads = 128",
        "hidden_size": HF + "rednote-hilab/dots.ocr/blob/main/config.json hidden_size=1536",
        "intermediate_size": HF + "rednote-hilab/dots.ocr/blob/main/config.json intermediate_size=8960",
        "vocab_size": HF + "rednote-hilab/dots.ocr/blob/main/config.json vocab_size=151936",
        "max_position_embeddings": HF + "rednote-hilab/dots.ocr/blob/main/config.json "
                                   "max_position_embeddings=131072",
        "vision_hidden_size": HF + "rednote-hilab/dots.ocr/blob/main/config.json vision_config.embed_dim=1536",
        "vision_intermediate_size": HF + "rednote-hilab/dots.ocr/blob/main/config.json "
                                    "vision_config.intermediate_size=4224",
        "patch_size": HF + "rednote-hilab/dots.ocr/blob/main/config.json vision_config.patch_size=14",
        "merge_size": HF + "rednote-hilab/dots.ocr/blob/main/config.json vision_config.spatial_merge_size=2",
        "min_pixels": "https://github.com/rednote-hilab/dots.ocr/blob/master/dots_ocr/utils/consts.py MIN_PIXELS=3136",
        "max_pixels": "https://github.com/rednote-hilab/dots.ocr/blob/master/dots_ocr/utils/consts.py "
                      "MAX_PIXELS=11289600 (README: 'performs optimally on images with a resolution under "
                      "11289600 pixels')",
        "token_formula": VLLM_GH + "vllm/model_executor/models/dots_ocr.py (Qwen2-VL-style grid)",
        "prompts": "https://github.com/rednote-hilab/dots.ocr/blob/master/dots_ocr/utils/prompts.py "
                   "(prompt_ocr; prompt_layout_all_en for structured markdown/HTML/LaTeX output)",
        "prompt_prefix": "https://github.com/rednote-hilab/dots.ocr/blob/master/dots_ocr/model/inference.py "
                         "(text prefixed with <|img|><|imgpad|><|endofimg|>, else vLLM v1 inserts a newline)",
        "sampling": "https://github.com/rednote-hilab/dots.ocr/blob/master/dots_ocr/model/inference.py "
                    "inference_with_vllm(temperature=0.1, top_p=0.9, max_completion_tokens=32768)",
        "vllm_flags": "https://github.com/rednote-hilab/dots.ocr#vllm-inference (vllm serve rednote-hilab/dots.ocr "
                      "--trust-remote-code); prefix/mm caches off as for every single-use OCR page "
                      "(vLLM recipes' configuration tips)",
        "min_vllm": "https://github.com/rednote-hilab/dots.ocr#vllm-inference ('Since vLLM version 0.11.0, Dots "
                    "OCR has been officially integrated into vLLM')",
    },
    notes="The model card warns that runs of '...' or '___' can repeat endlessly; prompt_ocr is the "
          "suggested fallback prompt.",
)

_QWEN25_SOURCES = {
    "dtype": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json torch_dtype bfloat16",
    "num_layers": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json num_hidden_layers=28",
    "num_attention_heads": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json num_attention_heads=28",
    "num_kv_heads": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json num_key_value_heads=4",
    "head_dim": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json hidden_size 3584 / 28 heads = 128",
    "hidden_size": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json hidden_size=3584",
    "intermediate_size": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json intermediate_size=18944",
    "vocab_size": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json vocab_size=152064",
    "max_position_embeddings": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json "
                               "max_position_embeddings=128000",
    "vision_hidden_size": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json vision_config.hidden_size=1280",
    "vision_intermediate_size": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json "
                                "vision_config.intermediate_size=3420",
    "patch_size": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/preprocessor_config.json patch_size=14",
    "merge_size": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/preprocessor_config.json merge_size=2",
    "min_pixels": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/preprocessor_config.json min_pixels=3136",
    "max_pixels": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/preprocessor_config.json max_pixels=12845056",
    "token_formula": VLLM_GH + "vllm/model_executor/models/qwen2_vl.py (grid_t*grid_h*grid_w / merge^2)",
    "parameters": HF + "Qwen/Qwen2.5-VL-7B-Instruct (safetensors 'Model size 8.29B params'); exact count: "
                  "transformers 5.20 Qwen2_5_VLForConditionalGeneration built from config.json on the meta "
                  "device = 8,292,166,656",
}

QWEN25_VL = ModelSpec(
    id="Qwen/Qwen2.5-VL-7B-Instruct",
    architecture="qwen2_5_vl",
    parameters=8_292_166_656,
    dtype="bfloat16",
    num_layers=28,
    num_attention_heads=28,
    num_kv_heads=4,
    head_dim=128,
    hidden_size=3584,
    intermediate_size=18944,
    vocab_size=152064,
    max_position_embeddings=128000,
    vision_hidden_size=1280,
    vision_intermediate_size=3420,
    patch_size=14,
    merge_size=2,
    min_pixels=3136,
    max_pixels=12845056,
    token_formula=GRID,
    prompts={
        "text": "Read all the text in the image.",
        "markdown": "Convert the document to markdown. Render tables as HTML and formulas as LaTeX.",
        "table": "Parse the table in the image into HTML.",
    },
    sampling={"temperature": 0.0, "repetition_penalty": 1.05, "max_tokens": 8192},
    vllm_flags=NO_CACHE_FLAGS,
    min_vllm="0.7.2",
    sources={
        **_QWEN25_SOURCES,
        "prompts": "ocrserve's own wording: the Qwen2.5-VL card gives no fixed OCR prompt ('Read all the text in "
                   "the image.' is its OCR cookbook example)",
        "sampling": HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/generation_config.json (repetition_penalty "
                    "1.05; its temperature 1e-06 / top_k 1 is greedy in effect, sent as temperature 0); "
                    "max_tokens 8192 is ocrserve's page budget (the card's examples use 128)",
        "vllm_flags": "no special flag (native architecture); prefix/mm caches off as for every single-use OCR "
                      "page (vLLM recipes' configuration tips)",
        "min_vllm": HF + "Qwen/Qwen2.5-VL-7B-Instruct (model card: vLLM > 0.7.2)",
    },
    notes="Generic Qwen2.5-VL entry: any Qwen2.5-VL fine-tune loads through a local path with its own config.",
)

# A full fine-tune of Qwen2.5-VL-7B-Instruct: the same architecture numbers.
OLMOCR_2 = replace(
    QWEN25_VL,
    id="allenai/olmOCR-2-7B-1025",
    max_pixels=1288 * 1288,
    token_formula=GRID,
    prompts=dict.fromkeys(("text", "markdown", "table"), (
        "Attached is one page of a document that you must process. Just return the plain text representation "
        "of this document as if you were reading it naturally. Convert equations to LateX and tables to HTML.\n"
        "If there are any figures or charts, label them with the following markdown syntax ![Alt text describing "
        "the contents of the figure](page_startx_starty_width_height.png)\nReturn your output as markdown, with a "
        "front matter section on top specifying values for the primary_language, is_rotation_valid, "
        "rotation_correction, is_table, and is_diagram parameters.")),
    image_first=False,
    sampling={"temperature": 0.1, "max_tokens": 8000},
    postprocess="strip_yaml_front_matter",
    vllm_flags=NO_CACHE_FLAGS,
    min_vllm="0.11.0",
    sources={
        **_QWEN25_SOURCES,
        "parameters": HF + "allenai/olmOCR-2-7B-1025 (full fine-tune of Qwen2.5-VL-7B-Instruct, same shapes); "
                      "exact count of that architecture: transformers 5.20 Qwen2_5_VLForConditionalGeneration on "
                      "the meta device = 8,292,166,656",
        "max_pixels": HF + "allenai/olmOCR-2-7B-1025 (model card: 'a single document image, rendered such that "
                      "the longest dimension is 1288 pixels'); 1288^2 bounds any page so rendered",
        "prompts": "https://github.com/allenai/olmocr/blob/main/olmocr/prompts/prompts.py "
                   "build_no_anchoring_v4_yaml_prompt (one prompt for every task; tables come back as HTML)",
        "sampling": "https://github.com/allenai/olmocr/blob/main/olmocr/pipeline.py (TEMPERATURE_BY_ATTEMPT "
                    "starts at 0.1, MAX_TOKENS 8000, MODEL_MAX_CONTEXT 16384; text part before the image)",
        "postprocess": "https://github.com/allenai/olmocr/blob/main/olmocr/pipeline.py (FrontMatterParser: the "
                       "reply is markdown under YAML front matter)",
        "vllm_flags": "olmOCR needs no special flag (Qwen2.5-VL is native in vLLM); prefix/mm caches off as "
                      "for every single-use OCR page (vLLM recipes' configuration tips)",
        "min_vllm": "https://github.com/allenai/olmocr (olmOCR v0.4 pipeline pins vllm 0.11.x); Qwen2.5-VL "
                    "itself is served since vLLM 0.7.2 (Qwen2.5-VL model card)",
    },
    notes="Render pages with the longest side 1288 px; repeat at higher temperature on a failed page "
          "(olmOCR's retry ladder).",
)

QWEN3_VL = ModelSpec(
    id="Qwen/Qwen3-VL-8B-Instruct",
    architecture="qwen3_vl",
    parameters=8_767_123_696,
    dtype="bfloat16",
    num_layers=36,
    num_attention_heads=32,
    num_kv_heads=8,
    head_dim=128,
    hidden_size=4096,
    intermediate_size=12288,
    vocab_size=151936,
    max_position_embeddings=262144,
    vision_hidden_size=1152,
    vision_intermediate_size=4304,
    patch_size=16,
    merge_size=2,
    min_pixels=65536,
    max_pixels=16777216,
    token_formula=GRID,
    prompts=QWEN25_VL.prompts,
    sampling={"temperature": 0.0, "presence_penalty": 1.5, "max_tokens": 16384},
    vllm_flags=NO_CACHE_FLAGS,
    min_vllm="0.11.0",
    sources={
        "parameters": HF + "Qwen/Qwen3-VL-8B-Instruct (BF16 shards total 17.53 GB => 8.77B); exact count: "
                      "transformers 5.20 Qwen3VLForConditionalGeneration built from config.json on the meta "
                      "device = 8,767,123,696",
        "dtype": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json text_config.dtype bfloat16",
        "num_layers": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json text_config.num_hidden_layers=36",
        "num_attention_heads": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json "
                               "text_config.num_attention_heads=32",
        "num_kv_heads": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json text_config.num_key_value_heads=8",
        "head_dim": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json text_config.head_dim=128",
        "hidden_size": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json text_config.hidden_size=4096",
        "intermediate_size": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json text_config."
                             "intermediate_size=12288",
        "vocab_size": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json text_config.vocab_size=151936",
        "max_position_embeddings": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json text_config."
                                   "max_position_embeddings=262144",
        "vision_hidden_size": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json vision_config.hidden_size=1152",
        "vision_intermediate_size": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json "
                                    "vision_config.intermediate_size=4304",
        "patch_size": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json vision_config.patch_size=16",
        "merge_size": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/config.json vision_config.spatial_merge_size=2",
        "min_pixels": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/preprocessor_config.json size.shortest_edge=65536",
        "max_pixels": HF + "Qwen/Qwen3-VL-8B-Instruct/blob/main/preprocessor_config.json "
                      "size.longest_edge=16777216",
        "token_formula": VLLM_GH + "vllm/model_executor/models/qwen3_vl.py (grid_h*grid_w / merge^2)",
        "prompts": "ocrserve's own wording (the card gives no fixed OCR prompt)",
        "sampling": HF + "Qwen/Qwen3-VL-8B-Instruct (card's VL settings: presence_penalty=1.5, "
                    "out_seq_length=16384; sampling replaced by greedy for OCR)",
        "vllm_flags": "no special flag (native architecture); prefix/mm caches off as for every single-use OCR "
                      "page (vLLM recipes' configuration tips)",
        "min_vllm": RECIPES + "Qwen/Qwen3-VL.md (Qwen3-VL served from vLLM 0.11.0)",
    },
    notes="Generic Qwen3-VL entry: any Qwen3-VL size loads through a local path with its own config.",
)

REGISTRY: dict[str, ModelSpec] = {
    spec.id: spec for spec in (HUNYUAN_OCR, PADDLEOCR_VL, DEEPSEEK_OCR, DOTS_OCR, OLMOCR_2, QWEN25_VL, QWEN3_VL)
}
DEFAULT_MODEL = HUNYUAN_OCR.id
_BY_ARCHITECTURE = {
    "hunyuan_vl": HUNYUAN_OCR,
    "paddleocr_vl": PADDLEOCR_VL,
    "deepseek_vl_v2": DEEPSEEK_OCR,
    "dots_ocr": DOTS_OCR,
    "qwen2_vl": QWEN25_VL,
    "qwen2_5_vl": QWEN25_VL,
    "qwen3_vl": QWEN3_VL,
}


def get_model(name: str) -> ModelSpec:
    """A registry entry by Hugging Face id (case-insensitive; the part after ``/`` also works), or a
    spec read from a local folder holding ``config.json``.

    Raises:
        ModelError: neither a known id nor a readable local checkpoint.
    """
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return from_local(path)
    wanted = name.strip().lower()
    for spec in REGISTRY.values():
        if wanted in (spec.id.lower(), spec.id.split("/", 1)[1].lower()):
            return spec
    raise ModelError(
        f"unknown model {name!r}; known: {', '.join(REGISTRY)} (or a local folder with config.json)"
    )


# ---------------------------------------------------------------------------------------------
# Local checkpoints
# ---------------------------------------------------------------------------------------------


def _text_config(config: dict) -> dict:
    for key in ("text_config", "language_config", "llm_config"):
        if isinstance(config.get(key), dict):
            return {**config, **config[key]}
    return config


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read JSON: {exc}") from exc


def _parameters_from_files(folder: Path, dtype_bytes: int) -> tuple[int, str] | None:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        total = _read_json(index).get("metadata", {}).get("total_size")
        if total:
            return int(total) // dtype_bytes, f"{index} metadata.total_size={total} bytes / {dtype_bytes}"
    shards = sorted(folder.glob("*.safetensors"))
    if shards:
        size = sum(s.stat().st_size for s in shards)
        return size // dtype_bytes, f"{len(shards)} safetensors file(s) in {folder}, {size} bytes / {dtype_bytes}"
    return None


def estimate_parameters(text: dict, vision: dict) -> int:
    """Parameters implied by a config: embeddings + decoder layers + vision blocks.

    Decoder layer: ``q,o = hidden x heads*head_dim`` each, ``k,v = hidden x kv_heads*head_dim`` each,
    gated MLP ``3 x hidden x intermediate``. Embeddings count twice unless tied. Vision block:
    ``4 x hidden^2`` attention + ``2 x hidden x intermediate`` MLP. Norms and biases are ignored
    (<0.1%).
    """
    h, inter = text["hidden_size"], text.get("intermediate_size", 4 * text["hidden_size"])
    heads = text["num_attention_heads"]
    hd = text.get("head_dim") or h // heads
    kvh = text.get("num_key_value_heads") or heads
    layer = 2 * h * heads * hd + 2 * h * kvh * hd + 3 * h * inter
    embed = text["vocab_size"] * h * (1 if text.get("tie_word_embeddings", False) else 2)
    vh = vision.get("hidden_size") or vision.get("embed_dim") or 0
    vi = vision.get("intermediate_size") or 4 * vh
    vision_params = (vision.get("depth") or vision.get("num_hidden_layers") or 0) * (4 * vh * vh + 2 * vh * vi)
    return embed + text["num_hidden_layers"] * layer + vision_params


def _pixel_bounds(folder: Path, template: ModelSpec) -> tuple[int | None, int | None, str]:
    pre = folder / "preprocessor_config.json"
    if template.token_formula == TILES or not pre.is_file():
        return template.min_pixels, template.max_pixels, f"{template.id} defaults ({pre.name} absent)"
    data = _read_json(pre)
    size = data.get("size") if isinstance(data.get("size"), dict) else {}
    lo = data.get("min_pixels") or size.get("shortest_edge") or template.min_pixels
    hi = data.get("max_pixels") or size.get("longest_edge") or template.max_pixels
    return lo, hi, str(pre)


def from_local(folder: str | Path) -> ModelSpec:
    """Build a spec from a local checkpoint folder's ``config.json`` (and its weight files).

    Numbers come from the folder: decoder sizes from ``config.json`` (flat or under
    ``text_config``/``language_config``), vision sizes from ``vision_config``, the pixel bounds from
    ``preprocessor_config.json``, the parameter count from ``model.safetensors.index.json``
    (``metadata.total_size`` / dtype bytes), the safetensors file sizes, or failing both
    :func:`estimate_parameters`. Prompts, sampling and flags come from the registry entry of the
    same ``model_type``.

    Raises:
        ModelError: no ``config.json``, an unsupported ``model_type`` or missing size fields.
    """
    folder = Path(folder).expanduser()
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{folder}: no config.json")
    config = _read_json(config_path)
    kind = config.get("model_type", "")
    template = _BY_ARCHITECTURE.get(kind)
    if template is None:
        raise ModelError(f"{config_path}: model_type {kind!r} is not supported; supported: "
                         f"{', '.join(sorted(_BY_ARCHITECTURE))}")
    text, vision = _text_config(config), config.get("vision_config") or {}
    try:
        heads = text["num_attention_heads"]
        hidden = text["hidden_size"]
        fields = {
            "num_layers": text["num_hidden_layers"],
            "num_attention_heads": heads,
            "num_kv_heads": text.get("num_key_value_heads") or heads,
            "head_dim": text.get("head_dim") or hidden // heads,
            "hidden_size": hidden,
            "intermediate_size": text.get("intermediate_size", template.intermediate_size),
            "vocab_size": text["vocab_size"],
            "max_position_embeddings": text.get("max_position_embeddings", template.max_position_embeddings),
        }
    except KeyError as exc:
        raise ModelError(f"{config_path}: missing {exc.args[0]!r}") from None
    dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or template.dtype)
    dtype = dtype if dtype in DTYPE_BYTES else template.dtype
    found = _parameters_from_files(folder, DTYPE_BYTES[dtype])
    if found is None:
        found = (estimate_parameters(text, vision),
                 f"estimated from {config_path} (embeddings + layers + vision blocks; no weight files)")
    lo, hi, pixel_source = _pixel_bounds(folder, template)
    cfg_src = f"{config_path}"
    return template.with_overrides(
        id=str(folder),
        parameters=int(found[0]),
        dtype=dtype,
        vision_hidden_size=vision.get("hidden_size") or vision.get("embed_dim") or template.vision_hidden_size,
        vision_intermediate_size=vision.get("intermediate_size") or template.vision_intermediate_size,
        patch_size=vision.get("patch_size", template.patch_size),
        merge_size=vision.get("spatial_merge_size", template.merge_size),
        min_pixels=lo,
        max_pixels=hi,
        sources={
            **template.sources,
            **dict.fromkeys(list(fields) + ["dtype", "vision_hidden_size", "vision_intermediate_size",
                                            "patch_size", "merge_size"], cfg_src),
            "parameters": found[1],
            "min_pixels": pixel_source,
            "max_pixels": pixel_source,
        },
        notes=f"local checkpoint ({kind}); recipe from {template.id}",
        **fields,
    )
