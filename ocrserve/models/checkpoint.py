"""Reading a local checkpoint folder: validated sizes, pixel bounds and the weight bytes vLLM loads.

A folder holds ``config.json`` (decoder sizes, flat or under ``text_config``/``language_config``/
``llm_config``; ``vision_config``; ``torch_dtype``/``dtype``; ``quantization_config``), optionally
``preprocessor_config.json`` (pixel bounds) and its weights (``model.safetensors.index.json`` and
``*.safetensors``). Every field the planner reads is validated by a pydantic model (sizes are
strict positive integers: ``"4096"``, ``4096.0``, ``true`` and ``null`` are refused; unknown keys
are allowed, configs carry many). Any problem is a :class:`~ocrserve.models.spec.ModelError` whose
message names the file and the JSON key path (``/m/config.json: text_config.num_hidden_layers:
expected a positive integer, got '28'``), never a traceback.

Weight bytes (:func:`weight_bytes`) follow the tensors vLLM allocates per linear layer for each
quantization method it loads from ``quantization_config``:

* ``awq`` (AutoAWQ, ``vllm/model_executor/layers/quantization/awq.py`` ``AWQLinearMethod``):
  ``qweight`` int32 ``[in, out / (32/bits)]``, ``qzeros`` int32 ``[in/group, out / (32/bits)]``,
  ``scales`` fp16 ``[in/group, out]``: ``bits/8`` bytes a weight plus ``2 + bits/8`` bytes a group.
* ``gptq`` (AutoGPTQ, ``quantization/gptq.py`` ``GPTQLinearMethod``): ``qweight`` int32
  ``[in / (32/bits), out]``, ``qzeros`` and ``scales`` as AWQ per group (``group_size`` -1: one
  group), plus ``g_idx`` int32 ``[in]``. (``gptq_marlin``/``awq_marlin`` repack to the same bits.)
* ``fp8`` (``quantization/fp8.py`` ``Fp8LinearMethod``): ``weight`` float8_e4m3fn ``[out, in]``, 1
  byte a weight, plus fp32 ``weight_scale`` per tensor, or ``weight_scale_inv`` per
  ``weight_block_size`` block.
* ``bitsandbytes`` (``quantization/bitsandbytes.py``; bitsandbytes ``Params4bit``/``Int8Params``):
  4-bit packs two values a byte with an fp32 ``absmax`` per 64-weight block (double quantization:
  a uint8 absmax per block plus an fp32 per 256 blocks); 8-bit is int8 plus an fp32 scale a row.

Embeddings, ``lm_head`` and the vision tower stay in the checkpoint dtype (AutoAWQ, AutoGPTQ,
llm-compressor and bitsandbytes leave them unquantized by default); norms and biases are ignored
(<0.1% of a 7B model).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from ocrserve.models.spec import DTYPE_BYTES, ModelError

Size = Annotated[StrictInt, Field(gt=0, lt=2**31)]
"""A size field: a JSON integer from 1 to 2^31 - 1 (no strings, floats, booleans or nulls; a
larger layer count, width or vocabulary is no real model's)."""

TEXT_KEYS = ("text_config", "language_config", "llm_config")
"""Keys under which VLM configs nest their decoder's sizes (Qwen3-VL, HunyuanOCR, InternVL ...)."""
TEXT_DECODERS = ("llama", "mistral", "qwen2", "qwen3")
"""``model_type`` values of plain dense decoders planned as text-only models (no MoE)."""
INDEX = "model.safetensors.index.json"
"""The sharded-safetensors index (``metadata.total_size``: bytes of all tensors)."""
PREPROCESSOR = "preprocessor_config.json"
"""The image processor's settings (``min_pixels``/``max_pixels`` or ``size``)."""


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def _kind(value: object) -> str:
    """The JSON kind of ``value`` for messages: ``a list``, ``an object``, ``a string`` ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), type(value).__name__)


def _show(value: object) -> str:
    """``value`` as a message shows it: ``null``, ``true``, ``'1000'``, ``a list`` ..."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (dict, list)):
        return _kind(value)
    return repr(value)


_EXPECTED = {
    "int_type": "expected a positive integer",
    "greater_than": "expected a positive integer",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a JSON object",
    "model_type": "expected a JSON object",
    "model_attributes_type": "expected a JSON object",
}


def _describe(exc: ValidationError, rename: Callable[[str], str]) -> str:
    """One ``key.path: problem`` per pydantic error, joined by ``; ``; ``rename`` maps the first key."""
    problems = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        if loc:
            loc[0] = rename(loc[0])
        where = ".".join(loc)
        if err["type"] == "missing":
            msg = "required, missing"
        elif err["type"] == "value_error":
            msg = str(err["ctx"]["error"])
        elif err["type"] in _EXPECTED:
            msg = f"{_EXPECTED[err['type']]}, got {_show(err['input'])}"
        else:
            msg = err["msg"]
        problems.append(f"{where}: {msg}" if where else msg)
    return "; ".join(problems)


def validate(
    model: type[BaseModel], data: object, path: Path, key: str = "", rename: Callable[[str], str] | None = None
) -> Any:
    """``data`` (a JSON value read from ``path``, found under ``key``) validated as ``model``.

    Args:
        model: the pydantic model.
        data: the JSON value.
        path: the file it came from (for messages).
        key: its key path in that file (``""`` for the whole file).
        rename: maps a field name to its key path in the file (default: ``key.field``).

    Raises:
        ModelError: ``data`` is no JSON object, or a field is missing or invalid; the message names
            ``path`` and the key path of each bad field.
    """
    where = f"{key}: " if key else ""
    if not isinstance(data, dict):
        raise ModelError(f"{path}: {where}expected a JSON object, got {_kind(data)}")
    rename = rename or (lambda name: f"{key}.{name}" if key else name)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ModelError(f"{path}: {_describe(exc, rename)}") from None


def read_json(path: Path) -> object:
    """The JSON value in ``path``.

    Raises:
        ModelError: unreadable, or not valid JSON; the message names ``path``.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ModelError(f"{path}: not valid JSON: {exc}") from None


# ---------------------------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------------------------


class _Open(BaseModel):
    """A config section: the fields the planner reads, every other key allowed and ignored."""

    model_config = ConfigDict(extra="allow", frozen=True)


class TextConfig(_Open):
    """The decoder's sizes (``config.json``, flat or under one of :data:`TEXT_KEYS`)."""

    hidden_size: Size
    num_hidden_layers: Size
    num_attention_heads: Size
    vocab_size: Size
    num_key_value_heads: Size | None = None
    head_dim: Size | None = None
    intermediate_size: Size | None = None
    max_position_embeddings: Size | None = None
    tie_word_embeddings: StrictBool | None = None
    sliding_window: Any = None  # read for a note only, never sized: left unvalidated
    use_sliding_window: Any = None

    @property
    def window(self) -> int | None:
        """The sliding-window length where attention uses one (Mistral v0.1: 4096), else ``None``."""
        on = self.use_sliding_window is not False
        size = self.sliding_window
        return size if on and isinstance(size, int) and not isinstance(size, bool) and size > 0 else None

    @property
    def kv_heads(self) -> int:
        """KV heads (``num_key_value_heads``; absent: one per attention head)."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        """Dimension of one head (``head_dim``; absent: ``hidden_size / num_attention_heads``)."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def mlp_size(self) -> int:
        """MLP intermediate size (``intermediate_size``; absent: ``4 x hidden_size``)."""
        return self.intermediate_size or 4 * self.hidden_size


class VisionConfig(_Open):
    """The vision encoder's sizes (``config.json`` ``vision_config``); all optional."""

    hidden_size: Size | None = None
    embed_dim: Size | None = None
    intermediate_size: Size | None = None
    depth: Size | None = None
    num_hidden_layers: Size | None = None
    patch_size: Size | None = None
    spatial_merge_size: Size | None = None

    @property
    def width(self) -> int:
        """Hidden size (``hidden_size`` or ``embed_dim``; 0 if neither)."""
        return self.hidden_size or self.embed_dim or 0

    @property
    def blocks(self) -> int:
        """Transformer blocks (``depth`` or ``num_hidden_layers``; 0 if neither)."""
        return self.depth or self.num_hidden_layers or 0


class _PixelSize(_Open):
    shortest_edge: Size | None = None
    longest_edge: Size | None = None


class ImageProcessorConfig(_Open):
    """Pixel bounds of ``preprocessor_config.json``: ``min_pixels``/``max_pixels`` or ``size``."""

    min_pixels: Size | None = None
    max_pixels: Size | None = None
    size: _PixelSize | None = None


def _total_size(value: object) -> int:
    """``metadata.total_size``: an integer, an integral float or a string of digits, from 1 byte to
    1 PiB (no model's weights are larger)."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and value.is_integer():
        value, ok = int(value), True
    elif isinstance(value, str) and value.strip().isdigit():
        value, ok = int(value.strip()), True
    if not ok or not 0 < value <= 2**50:
        raise ValueError(f"expected a positive integer of bytes up to 1 PiB, got {_show(value)}")
    return value


class _IndexMetadata(_Open):
    total_size: Annotated[int, BeforeValidator(_total_size)] | None = None


class SafetensorsIndex(_Open):
    """:data:`INDEX`: ``metadata.total_size`` (bytes of every tensor, as stored)."""

    metadata: _IndexMetadata | None = None


# ---------------------------------------------------------------------------------------------
# quantization_config
# ---------------------------------------------------------------------------------------------


class _Quant(_Open):
    quant_method: StrictStr

    def linear_bytes(self, fan_in: int, fan_out: int) -> int:  # pragma: no cover - abstract
        """Bytes vLLM allocates for one ``fan_in x fan_out`` linear weight."""
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover - abstract
        """The method and its settings, for sources."""
        raise NotImplementedError


def _groups(fan_in: int, group_size: int) -> int:
    """Quantization groups along the input dimension (``group_size`` -1: one per column)."""
    return 1 if group_size == -1 else math.ceil(fan_in / group_size)


class AwqConfig(_Quant):
    """AutoAWQ: 4-bit weights packed 8 to an int32, fp16 scales and packed zeros per group."""

    bits: Literal[4] = Field(validation_alias=AliasChoices("bits", "w_bit"))
    group_size: Size = Field(validation_alias=AliasChoices("group_size", "q_group_size"))
    zero_point: StrictBool = True

    def linear_bytes(self, fan_in: int, fan_out: int) -> int:
        """``in x out x bits/8`` (qweight) + ``in/group x out x (2 + bits/8)`` (scales, qzeros)."""
        groups = _groups(fan_in, self.group_size)
        return fan_in * fan_out * self.bits // 8 + groups * fan_out * (16 + self.bits) // 8

    def describe(self) -> str:
        return f"awq {self.bits}-bit, group {self.group_size}"


class GptqConfig(_Quant):
    """AutoGPTQ: b-bit weights packed ``32/b`` to an int32, fp16 scales and packed zeros per group,
    an int32 group index per input row."""

    bits: Literal[2, 3, 4, 8]
    group_size: StrictInt

    @field_validator("group_size")
    @classmethod
    def _group(cls, value: int) -> int:
        if value != -1 and value <= 0:
            raise ValueError(f"expected a positive integer or -1 (one group), got {value}")
        return value

    def linear_bytes(self, fan_in: int, fan_out: int) -> int:
        """``in x out x bits/8`` + ``groups x out x (2 + bits/8)`` + ``4 x in`` (g_idx)."""
        groups = _groups(fan_in, self.group_size)
        return fan_in * fan_out * self.bits // 8 + groups * fan_out * (16 + self.bits) // 8 + 4 * fan_in

    def describe(self) -> str:
        return f"gptq {self.bits}-bit, group {self.group_size}"


class Fp8Config(_Quant):
    """FP8 (E4M3) weights, 1 byte each, fp32 scales per tensor or per ``weight_block_size`` block."""

    weight_block_size: Annotated[list[Size], Field(min_length=2, max_length=2)] | None = None

    def linear_bytes(self, fan_in: int, fan_out: int) -> int:
        """``in x out`` + 4 bytes per tensor, or per ``[block_out, block_in]`` block."""
        if self.weight_block_size is None:
            return fan_in * fan_out + 4
        block_out, block_in = self.weight_block_size
        return fan_in * fan_out + 4 * math.ceil(fan_out / block_out) * math.ceil(fan_in / block_in)

    def describe(self) -> str:
        blocks = f", {self.weight_block_size[0]}x{self.weight_block_size[1]} blocks" if self.weight_block_size else ""
        return f"fp8{blocks}"


class BnbConfig(_Quant):
    """bitsandbytes pre-quantized weights: 4-bit (``load_in_4bit``) or 8-bit (``load_in_8bit``)."""

    quant_method: StrictStr = "bitsandbytes"
    load_in_4bit: StrictBool = False
    load_in_8bit: StrictBool = False
    bnb_4bit_use_double_quant: StrictBool = False

    @model_validator(mode="after")
    def _one_width(self) -> BnbConfig:
        if self.load_in_4bit == self.load_in_8bit:
            raise ValueError("load_in_4bit/load_in_8bit: exactly one must be true")
        return self

    def linear_bytes(self, fan_in: int, fan_out: int) -> int:
        """4-bit: ``n/2`` + absmax (fp32 per 64, or uint8 per 64 + fp32 per 256 x 64); 8-bit: ``n`` + fp32 a row."""
        n = fan_in * fan_out
        if self.load_in_8bit:
            return n + 4 * fan_out
        blocks = math.ceil(n / 64)
        absmax = blocks + 4 * math.ceil(blocks / 256) if self.bnb_4bit_use_double_quant else 4 * blocks
        return n // 2 + absmax

    def describe(self) -> str:
        double = ", double-quantized" if self.bnb_4bit_use_double_quant and self.load_in_4bit else ""
        return f"bitsandbytes {'4' if self.load_in_4bit else '8'}-bit{double}"


QUANT_METHODS: dict[str, type[_Quant]] = {
    "awq": AwqConfig,
    "bitsandbytes": BnbConfig,
    "fp8": Fp8Config,
    "gptq": GptqConfig,
}
"""``quantization_config.quant_method`` -> the config whose weight bytes the planner can size."""

Quantization = AwqConfig | BnbConfig | Fp8Config | GptqConfig


def read_quantization(data: object, path: Path, key: str) -> Quantization:
    """``quantization_config`` (found under ``key`` in ``path``) validated for its method.

    A config without ``quant_method`` but with ``load_in_4bit``/``load_in_8bit`` is bitsandbytes
    (transformers < 4.37 wrote none).

    Raises:
        ModelError: not an object, a missing or unknown ``quant_method`` (the message lists
            :data:`QUANT_METHODS`), or an invalid setting.
    """
    if not isinstance(data, dict):
        raise ModelError(f"{path}: {key}: expected a JSON object, got {_kind(data)}")
    method = data.get("quant_method")
    if method is None and ("load_in_4bit" in data or "load_in_8bit" in data):
        method = "bitsandbytes"
    if not isinstance(method, str):
        raise ModelError(f"{path}: {key}.quant_method: expected a string, got {_show(method)}")
    model = QUANT_METHODS.get(method.lower())
    if model is None:
        raise ModelError(
            f"{path}: {key}.quant_method: {method!r} is not a quantization the planner can size; "
            f"supported: {', '.join(QUANT_METHODS)}"
        )
    return validate(model, {**data, "quant_method": method.lower()}, path, key)


# ---------------------------------------------------------------------------------------------
# Counting
# ---------------------------------------------------------------------------------------------


def decoder_linears(text: TextConfig) -> list[tuple[int, int]]:
    """``(fan_in, fan_out)`` of each linear weight of one decoder layer: q, k, v, o, gate, up, down."""
    h, inter = text.hidden_size, text.mlp_size
    q, kv = text.num_attention_heads * text.head_size, text.kv_heads * text.head_size
    return [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]


def embedding_parameters(text: TextConfig) -> int:
    """``vocab x hidden``, twice unless ``tie_word_embeddings`` (input embeddings and ``lm_head``)."""
    return text.vocab_size * text.hidden_size * (1 if text.tie_word_embeddings else 2)


def vision_parameters(vision: VisionConfig) -> int:
    """Vision blocks x (``4 x hidden^2`` attention + ``2 x hidden x intermediate`` MLP); 0 without one."""
    width = vision.width
    return vision.blocks * (4 * width * width + 2 * width * (vision.intermediate_size or 4 * width))


def estimate_parameters(text: TextConfig, vision: VisionConfig | None = None) -> int:
    """Parameters implied by a config: embeddings + decoder layers + vision blocks (unquantized).

    Decoder layer: ``q,o = hidden x heads*head_dim`` each, ``k,v = hidden x kv_heads*head_dim`` each,
    gated MLP ``3 x hidden x intermediate`` (:func:`decoder_linears`). Embeddings count twice unless
    tied. Vision block: ``4 x hidden^2`` attention + ``2 x hidden x intermediate`` MLP. Norms and
    biases are ignored (<0.1%).
    """
    layer = sum(i * o for i, o in decoder_linears(text))
    return embedding_parameters(text) + text.num_hidden_layers * layer + vision_parameters(vision or VisionConfig())


def weight_bytes(text: TextConfig, vision: VisionConfig | None, dtype_bytes: int, quant: Quantization | None) -> int:
    """Bytes of weights vLLM allocates for a config: decoder linears at ``quant``'s packing (see the
    module docstring), embeddings, ``lm_head`` and vision tower at ``dtype_bytes`` per parameter.

    Without ``quant``: ``estimate_parameters x dtype_bytes``.
    """
    if quant is None:
        return estimate_parameters(text, vision) * dtype_bytes
    layer = sum(quant.linear_bytes(i, o) for i, o in decoder_linears(text))
    unquantized = embedding_parameters(text) + vision_parameters(vision or VisionConfig())
    return text.num_hidden_layers * layer + unquantized * dtype_bytes


# ---------------------------------------------------------------------------------------------
# The folder
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """Bytes of the weight files in a folder and where the number comes from."""

    bytes: int
    source: str


@dataclass(frozen=True)
class Pixels:
    """``preprocessor_config.json``'s pixel bounds, px per page (``None`` where it gives none)."""

    min_pixels: int | None
    max_pixels: int | None
    source: str


@dataclass(frozen=True)
class Checkpoint:
    """A local checkpoint folder, read and validated.

    Attributes:
        folder: the folder.
        config_path: its ``config.json``.
        model_type: ``config.json`` ``model_type``.
        text: the decoder's sizes.
        text_key: the key they were nested under (``text_config`` ...), ``""`` for a flat config.
        vision: the vision encoder's sizes (all ``None`` for a text-only config).
        dtype: ``torch_dtype``/``dtype``, a key of :data:`DTYPE_BYTES`; ``None`` if absent.
        dtype_key: the key path ``dtype`` was read from.
        quantization: the validated ``quantization_config``, ``None`` if unquantized.
        stored: bytes of the weight files, ``None`` without any.
        pixels: the preprocessor's bounds, ``None`` without ``preprocessor_config.json``.
        nested_keys: the keys of the nested decoder section (for :meth:`key`).
        top_keys: the top-level keys of ``config.json`` (for :meth:`key`).
    """

    folder: Path
    config_path: Path
    model_type: str
    text: TextConfig
    text_key: str
    vision: VisionConfig
    dtype: str | None
    dtype_key: str
    quantization: Quantization | None
    stored: Stored | None
    pixels: Pixels | None

    nested_keys: frozenset[str] = frozenset()
    top_keys: frozenset[str] = frozenset()

    def key(self, name: str) -> str:
        """The key path of field ``name`` in ``config.json`` (:func:`key_path`)."""
        return key_path(name, self.text_key, self.nested_keys, self.top_keys)


def key_path(name: str, text_key: str, nested: Collection[str], top: Collection[str]) -> str:
    """Where decoder field ``name`` is (or belongs) in ``config.json``: ``text_key.name`` when it is
    in the nested section, or in neither; ``name`` when only the top level has it."""
    return f"{text_key}.{name}" if text_key and (name in nested or name not in top) else name


def _text_section(config: dict, path: Path) -> tuple[dict, str]:
    """The decoder's fields (a nested section over the top level) and the nested key, if any."""
    for key in TEXT_KEYS:
        if config.get(key) is not None:
            if not isinstance(config[key], dict):
                raise ModelError(f"{path}: {key}: expected a JSON object, got {_kind(config[key])}")
            return {**config, **config[key]}, key
    return config, ""


def _check_heads(text: TextConfig, path: Path, key: Callable[[str], str]) -> None:
    """Heads that vLLM could not lay out: KV heads not dividing query heads, an uneven head_dim.

    Raises:
        ModelError: naming the file and field.
    """
    heads, kv = text.num_attention_heads, text.kv_heads
    if heads % kv:
        raise ModelError(
            f"{path}: {key('num_key_value_heads')}: {kv} does not divide {key('num_attention_heads')} {heads}"
        )
    if text.head_dim is None and text.hidden_size % heads:
        raise ModelError(
            f"{path}: {key('hidden_size')}: {text.hidden_size} is not a multiple of "
            f"{key('num_attention_heads')} {heads}, and head_dim is absent"
        )


def _dtype(config: dict, path: Path, text_key: str) -> tuple[str | None, str]:
    """``torch_dtype``/``dtype`` and its key path: the top level first, then the nested decoder
    section (vLLM's order, ``vllm/config/model.py`` ``_get_and_verify_dtype``); ``None`` if absent.

    Raises:
        ModelError: a value that is not one of :data:`DTYPE_BYTES` (``int8``, ``auto``, a number ...).
    """
    nested = config.get(text_key) if text_key else None
    for section, prefix in ((config, ""), (nested, f"{text_key}.")):
        for name in ("torch_dtype", "dtype"):
            if isinstance(section, dict) and section.get(name) is not None:
                value = section[name]
                if not isinstance(value, str) or value not in DTYPE_BYTES:
                    raise ModelError(
                        f"{path}: {prefix}{name}: {_show(value)} is not a dtype the planner knows; "
                        f"expected one of {', '.join(DTYPE_BYTES)}"
                    )
                return value, f"{prefix}{name}"
    return None, ""


def _stored(folder: Path) -> Stored | None:
    """Bytes of the weights on disk: :data:`INDEX` ``metadata.total_size``, else the sum of the
    ``*.safetensors`` files (their JSON headers, a few KiB to MiB, are counted too; ``consolidated*``
    files are skipped when others exist: Mistral repositories ship both layouts), else ``None``.

    Raises:
        ModelError: an index that is not valid JSON, not an object, or has a non-numeric
            ``metadata.total_size``.
    """
    index = folder / INDEX
    if index.is_file():
        total = validate(SafetensorsIndex, read_json(index), index).metadata
        if total is not None and total.total_size:
            return Stored(total.total_size, f"{index} metadata.total_size={total.total_size} bytes")
    shards = sorted(folder.glob("*.safetensors"))
    if any(not s.name.startswith("consolidated") for s in shards):
        shards = [s for s in shards if not s.name.startswith("consolidated")]
    if not shards:
        return None
    size = sum(s.stat().st_size for s in shards)
    return Stored(size, f"{len(shards)} safetensors file(s) in {folder}, {size} bytes")


def _pixels(folder: Path) -> Pixels | None:
    """``preprocessor_config.json``'s bounds (``min_pixels``/``max_pixels``, else ``size``'s
    ``shortest_edge``/``longest_edge``); ``None`` without the file.

    Raises:
        ModelError: invalid JSON, a non-object, a bound that is no positive integer, or
            ``min_pixels`` above ``max_pixels``.
    """
    path = folder / PREPROCESSOR
    if not path.is_file():
        return None
    pre = validate(ImageProcessorConfig, read_json(path), path)
    size = pre.size or _PixelSize()
    lo, hi = pre.min_pixels or size.shortest_edge, pre.max_pixels or size.longest_edge
    if lo is not None and hi is not None and lo > hi:
        raise ModelError(f"{path}: min_pixels: {lo} exceeds max_pixels {hi}")
    return Pixels(lo, hi, str(path))


def read_checkpoint(folder: str | Path, model_types: Collection[str] | None = None) -> Checkpoint:
    """Read and validate ``folder``'s ``config.json``, preprocessor config and weight files.

    Args:
        folder: the checkpoint folder.
        model_types: the accepted ``model_type`` values (checked before any size); ``None``: any.

    Raises:
        ModelError: no ``config.json``; a ``model_type`` not in ``model_types`` (the message lists
            them); any file unreadable or not valid JSON; a file or section
            that is no JSON object; a missing, non-integer or non-positive size; KV heads that do not
            divide attention heads; an unknown dtype; an unknown or invalid ``quantization_config``;
            a non-numeric ``metadata.total_size``; a bad pixel bound. The message names the file
            and the key path.
    """
    folder = Path(folder).expanduser()
    path = folder / "config.json"
    if not path.is_file():
        raise ModelError(f"{folder}: no config.json")
    config = read_json(path)
    if not isinstance(config, dict):
        raise ModelError(f"{path}: expected a JSON object, got {_kind(config)}")
    kind = config.get("model_type", "")
    if not isinstance(kind, str):
        raise ModelError(f"{path}: model_type: expected a string, got {_show(kind)}")
    if model_types is not None and kind not in model_types:
        raise ModelError(f"{path}: model_type {kind!r} is not supported; supported: {', '.join(sorted(model_types))}")
    merged, text_key = _text_section(config, path)
    nested, top = frozenset(config.get(text_key) or ()), frozenset(config)

    def key(name: str) -> str:
        return key_path(name, text_key, nested, top)

    text = validate(TextConfig, merged, path, rename=key)
    _check_heads(text, path, key)
    vision_data = config.get("vision_config")
    vision = VisionConfig() if vision_data is None else validate(VisionConfig, vision_data, path, "vision_config")
    dtype, dtype_key = _dtype(config, path, text_key)
    quant_data = merged.get("quantization_config")
    quant = None if quant_data is None else read_quantization(quant_data, path, key("quantization_config"))
    stored, pixels = _stored(folder), _pixels(folder)
    return Checkpoint(folder, path, kind, text, text_key, vision, dtype, dtype_key, quant, stored, pixels, nested, top)


def text_fields(text: TextConfig, default_max_position: int) -> dict[str, int]:
    """The :class:`~ocrserve.models.spec.ModelSpec` decoder fields of ``text``
    (``max_position_embeddings`` absent: ``default_max_position``)."""
    return {
        "num_layers": text.num_hidden_layers,
        "num_attention_heads": text.num_attention_heads,
        "num_kv_heads": text.kv_heads,
        "head_dim": text.head_size,
        "hidden_size": text.hidden_size,
        "intermediate_size": text.mlp_size,
        "vocab_size": text.vocab_size,
        "max_position_embeddings": text.max_position_embeddings or default_max_position,
    }


def as_config(data: Mapping[str, Any] | BaseModel, model: type[BaseModel], what: str) -> Any:
    """``data`` as ``model`` (a plain mapping is validated; ``what`` names it in errors).

    Raises:
        ModelError: invalid ``data``.
    """
    if isinstance(data, model):
        return data
    return validate(model, dict(data) if isinstance(data, Mapping) else data, Path(what))
