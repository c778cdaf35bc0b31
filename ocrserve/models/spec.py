"""The model spec: what the memory planner and the vLLM engine know about one OCR model.

The values live in data files (``ocrserve/models/registry/*.yaml``, loaded by
:mod:`ocrserve.models.schema`); this module holds the type and the arithmetic on it. The
visual-token geometry is :mod:`ocrserve.preprocess.geometry`'s, parameterized by the spec.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ocrserve.preprocess import geometry

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
"""Bytes per element of each checkpoint dtype the planner knows."""
CHAT_TEMPLATE_TOKENS = 32
"""Tokens the chat template wraps around one user turn with one image (role markers, image start/end
markers, generation prompt). Estimate: Qwen2-VL's template adds 17 tokens around an image and a text
(``<|im_start|>user\\n<|vision_start|>``...``<|im_end|>\\n<|im_start|>assistant\\n``); 32 leaves
room for templates with a system turn (HunyuanOCR sends an empty one)."""

GRID = "grid"
"""Token formula of Qwen2-VL-style encoders: one token per ``factor x factor`` block (plus
:attr:`ModelSpec.row_tokens` per row and :attr:`ModelSpec.image_tokens` per image)."""
TILES = "tiles"
"""Token formula of DeepSeek-OCR's Gundam tiling (a global view plus local tiles)."""
TEXT = "text"
"""Token formula of a text-only decoder (a local Llama/Qwen2/Qwen3/Mistral checkpoint): no image
input, zero visual tokens; planned so the planner's memory terms can be checked against more logs."""
TASKS = ("text", "markdown", "table")
"""The OCR tasks every recipe has a prompt for."""
#: The markup of each task's reply (a page's ``markup``): plain text, Markdown, or HTML tables (the
#: prompts ask for these; see each registry entry's ``prompts``).
TASK_MARKUP = {"text": "text", "markdown": "markdown", "table": "html"}


class ModelError(LookupError):
    """An unknown model id, or a local folder that cannot be read as a supported model."""


@dataclass(frozen=True)
class ModelSpec:
    """One OCR model as the planner and the vLLM engine see it.

    Sizes are per model (not per GPU). ``min_pixels``/``max_pixels`` are ``None`` for models whose
    processor tiles pages itself (DeepSeek-OCR), whose pixel budget is not a vLLM knob, and for
    text-only decoders (:data:`TEXT`).

    Attributes:
        id: Hugging Face id (or the local folder path).
        architecture: ``config.json`` ``model_type`` family this spec follows.
        parameters: total parameters, language model plus vision encoder.
        dtype: checkpoint dtype vLLM loads by default (``--dtype auto``), a key of :data:`DTYPE_BYTES`.
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
        min_pixels: the processor's lower pixel bound, px per page (``None`` for tiling models).
        max_pixels: the processor's upper pixel bound, px per page (``None`` for tiling models).
        token_formula: :data:`GRID` (``(h/f) * (w/f + row_tokens) + image_tokens``),
            :data:`TILES` (DeepSeek-OCR Gundam tiling, sized by :attr:`tiles`) or :data:`TEXT`
            (a text-only decoder: no visual tokens, vision sizes 0, patch and merge 1).
        prompts: instruction per task: ``text`` (plain text), ``markdown``, ``table``.
        sampling: OpenAI chat-completions parameters (vLLM spelling; ``max_tokens`` always set).
        retry_sampling: what the one retry of a page cut by ``max_tokens`` changes in
            ``sampling`` (the card's stronger repetition guard); empty = no retry.
        vllm_flags: ``vllm serve`` flags the model needs beyond the planned ones.
        min_vllm: lowest vLLM release that serves the model.
        sources: field name -> where its value comes from.
        prompt_prefix: text the engine puts before the instruction in the same user turn.
        system_prompt: system turn content, ``None`` for no system turn.
        image_first: whether the image part precedes the text part in the user turn.
        postprocess: name of the output clean-up the model card applies (``""`` for none).
        notes: anything an operator should know.
        tiles: for :data:`TILES`: ``base_queries``, ``tile_queries``, ``tile_size`` (px),
            ``min_crops``, ``max_crops``.
        row_tokens: for :data:`GRID`: extra tokens per row of visual tokens (HunyuanOCR: 1, a newline).
        image_tokens: for :data:`GRID`: extra tokens per image (HunyuanOCR: 2, begin/end).
        profile_image: ``(height, width)`` px of the image vLLM profiles the encoder with at
            start-up, where it matters for the largest page (HunyuanOCR: 8192 x 512); else ``None``.
        quantization: the checkpoint's ``quantization_config.quant_method``, lower-case (``awq``,
            ``gptq``, ``fp8``, ``bitsandbytes``); ``""`` for an unquantized checkpoint.
        weight_bytes: bytes of weights vLLM loads, where known better than ``parameters x
            dtype_bytes`` (a local folder's safetensors index or files, or the quantized estimate of
            :func:`ocrserve.models.checkpoint.weight_bytes`); ``0`` = compute (:attr:`weights_bytes`).
        output_tokens: prior of output tokens per page by task (``{task: {median, p95}, runaway:
            share}``), cited in the registry; empty = ocrserve's default (an estimate).
        speculative: the speculative decoder the model ships (``method``, ``model``,
            ``num_speculative_tokens``, draft ``parameters``, ``kv_layers``, ``speedup`` pairs), or
            ``None``; the planner emits ``--speculative-config`` from it when asked.
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
    row_tokens: int = 0
    image_tokens: int = 0
    profile_image: tuple[int, int] | None = None
    retry_sampling: Mapping[str, object] = field(default_factory=dict)
    quantization: str = ""
    weight_bytes: int = 0
    output_tokens: Mapping[str, object] = field(default_factory=dict)
    speculative: Mapping[str, object] | None = None

    @property
    def factor(self) -> int:
        """Page sides are rounded to multiples of this, px (patch size x merge size)."""
        return self.patch_size * self.merge_size

    @property
    def dtype_bytes(self) -> int:
        """Bytes per weight/activation element in :attr:`dtype`."""
        return DTYPE_BYTES[self.dtype]

    @property
    def weights_bytes(self) -> int:
        """Bytes of weights vLLM loads (whole model, before any tensor/pipeline split):
        :attr:`weight_bytes` where set (on-disk size or quantized estimate), else
        ``parameters x dtype_bytes`` (an unquantized checkpoint in :attr:`dtype`)."""
        return self.weight_bytes or self.parameters * self.dtype_bytes

    @property
    def max_tokens(self) -> int:
        """The output-token budget per page the recipe sets."""
        return int(self.sampling["max_tokens"])

    @property
    def supports_pixel_budget(self) -> bool:
        """Whether vLLM takes ``min_pixels``/``max_pixels`` through ``--mm-processor-kwargs``
        (:data:`GRID` models only; not tiling or text-only ones)."""
        return self.token_formula == GRID

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

        :data:`GRID`: :func:`ocrserve.preprocess.geometry.visual_tokens` with this model's factor,
        :attr:`row_tokens` and :attr:`image_tokens`. :data:`TILES`:
        :func:`ocrserve.preprocess.geometry.tile_tokens` with :attr:`tiles`. :data:`TEXT`: 0.
        """
        if self.token_formula == TEXT:
            return 0
        if self.token_formula == TILES:
            return geometry.tile_tokens(height, width, **self.tiles)
        return geometry.visual_tokens(
            height, width, self.factor, row_tokens=self.row_tokens, image_tokens=self.image_tokens
        )

    def max_visual_tokens(self, min_pixels: int | None = None, max_pixels: int | None = None) -> int:
        """The most visual tokens one page can cost under the pixel budget (default: the model's).

        :data:`GRID`: :func:`ocrserve.preprocess.geometry.max_visual_tokens` (``max_pixels // f**2``
        without per-row tokens; HunyuanOCR: the larger of a square page at ``max_pixels`` and vLLM's
        512 x 8192 px profiling image). :data:`TILES`: the worst tiling, 1 x 6 tiles (933 tokens).
        :data:`TEXT`: 0 (no image input).
        """
        if self.token_formula == TEXT:
            return 0
        if self.token_formula == TILES:
            t = self.tiles
            return geometry.max_tile_tokens(
                base_queries=t["base_queries"],
                tile_queries=t["tile_queries"],
                min_crops=t["min_crops"],
                max_crops=t["max_crops"],
            )
        lo = min_pixels if min_pixels is not None else self.min_pixels
        hi = max_pixels if max_pixels is not None else self.max_pixels
        return geometry.max_visual_tokens(
            self.factor,
            lo,
            hi,
            row_tokens=self.row_tokens,
            image_tokens=self.image_tokens,
            profile_image=self.profile_image,
        )

    def with_overrides(self, **changes) -> ModelSpec:
        """A copy with some fields replaced (for tests and local checkpoints)."""
        return replace(self, **changes)
