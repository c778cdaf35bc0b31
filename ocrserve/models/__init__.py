"""OCR model registry: the numbers the memory planner needs and the request recipe for each model.

Each :class:`ModelSpec` (:mod:`ocrserve.models.spec`) carries

* the memory facts: parameter count, dtype, decoder layers, KV heads, head dim (KV-cache bytes per
  token), hidden/intermediate sizes (activation estimate), vision-encoder sizes;
* the vision facts: patch size x merge size (the *factor* both page sides are rounded to), the
  model card's pixel bounds and the parameters of the visual-token formula
  (:mod:`ocrserve.preprocess.geometry`);
* the request recipe: prompts per task (``text``, ``markdown``, ``table``), sampling (greedy,
  ``max_tokens`` always set, the repetition guards the model card asks for) and the post-processing
  the card applies;
* the serving facts: ``vllm serve`` flags the model card or vLLM recipe requires and the lowest vLLM
  release that serves the model.

The entries are data: one YAML file per model in ``ocrserve/models/registry/``, every value with
its source (model card, ``config.json``, ``preprocessor_config.json``, vLLM source or recipe; where a
number is an estimate the source says so and explains it), validated on import by
:mod:`ocrserve.models.schema`; the citations end up in :attr:`ModelSpec.sources`. A local checkpoint
folder (one with ``config.json``) becomes a spec through :func:`from_local`, which reads the numbers
from its own files (validated by :mod:`ocrserve.models.checkpoint`) and takes the recipe from the
registry entry of the same architecture; a plain Llama/Mistral/Qwen2/Qwen3 decoder plans as a
text-only model (:data:`TEXT`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ocrserve.models import checkpoint
from ocrserve.models.schema import Registry, RegistryError, load_registry
from ocrserve.models.spec import CHAT_TEMPLATE_TOKENS, DTYPE_BYTES, GRID, TASKS, TEXT, TILES, ModelError, ModelSpec

__all__ = [
    "BY_ARCHITECTURE",
    "CHAT_TEMPLATE_TOKENS",
    "DEFAULT_MODEL",
    "DTYPE_BYTES",
    "GRID",
    "REGISTRY",
    "TASKS",
    "TEXT",
    "TILES",
    "ModelError",
    "ModelSpec",
    "Registry",
    "RegistryError",
    "estimate_parameters",
    "from_local",
    "get_model",
    "list_models",
    "load_registry",
]

_LOADED = load_registry()
REGISTRY: dict[str, ModelSpec] = _LOADED.specs
"""Hugging Face id -> spec, in the entries' ``order`` (the shipped ``registry/*.yaml``)."""
BY_ARCHITECTURE: dict[str, ModelSpec] = _LOADED.by_architecture
"""``config.json`` ``model_type`` -> the entry whose recipe a local checkpoint of that type takes."""
DEFAULT_MODEL = "tencent/HunyuanOCR"
"""The model ``ocrserve plan`` plans for when given no ``--model`` and no profile model of its own."""
if DEFAULT_MODEL not in REGISTRY:  # pragma: no cover - a packaging error
    raise RegistryError(f"default model {DEFAULT_MODEL!r} has no entry in {', '.join(_LOADED.files.values())}")


def list_models() -> list[ModelSpec]:
    """The registry entries in listing order (``order`` in their files)."""
    return list(REGISTRY.values())


def get_model(name: str) -> ModelSpec:
    """A registry entry by Hugging Face id (case-insensitive; the part after ``/`` also works), or a
    spec read from a local folder holding ``config.json`` (:func:`from_local`).

    Raises:
        ModelError: neither a known id nor a readable local checkpoint; a name spelled as a path
            (``/``, ``.`` or ``~`` first) that is no folder, or a folder without ``config.json``.
    """
    path = Path(name).expanduser()
    try:
        has_config = (path / "config.json").is_file()
    except OSError as exc:  # an unreadable folder, a symlink loop
        raise ModelError(f"{name!r}: cannot read the folder: {exc.strerror or exc}") from None
    if has_config:
        return from_local(path)
    if path.is_dir():
        raise ModelError(f"{name!r} holds no config.json, so it is no model folder")
    if name.startswith(("/", ".", "~")):
        raise ModelError(f"no such model folder: {name!r}")
    wanted = name.strip().lower()
    for spec in REGISTRY.values():
        if wanted in (spec.id.lower(), spec.id.split("/", 1)[1].lower()):
            return spec
    raise ModelError(f"unknown model {name!r}; known: {', '.join(REGISTRY)} (or a local folder with config.json)")


# ---------------------------------------------------------------------------------------------
# Local checkpoints
# ---------------------------------------------------------------------------------------------


def estimate_parameters(text: Mapping[str, Any], vision: Mapping[str, Any] | None = None) -> int:
    """Parameters implied by a config's decoder section ``text`` and ``vision_config`` ``vision``:
    embeddings + decoder layers + vision blocks (:func:`ocrserve.models.checkpoint.estimate_parameters`).

    Raises:
        ModelError: a missing or invalid size field (the message names it).
    """
    return checkpoint.estimate_parameters(
        checkpoint.as_config(text, checkpoint.TextConfig, "text config"),
        checkpoint.as_config(vision or {}, checkpoint.VisionConfig, "vision config"),
    )


MIN_STORED_SHARE = 0.5
"""Stored weights below this share of what the config's sizes imply are refused: such a folder is
truncated or a placeholder (estimates are within about 1% of real checkpoints)."""


def _weights(ckpt: checkpoint.Checkpoint, dtype: str) -> tuple[int, int, str, str]:
    """``(parameters, weight_bytes, parameters source, weight_bytes source)`` of a local folder.

    Unquantized: the stored bytes (index ``total_size`` or the safetensors files) are the weights
    and ``/ dtype bytes`` the parameters; without files, :func:`checkpoint.estimate_parameters`
    (``weight_bytes`` 0: ``parameters x dtype bytes``). Quantized: ``parameters`` is always the
    unquantized estimate from ``config.json``; the weights are the stored bytes (packed as vLLM loads
    them) or, without files, :func:`checkpoint.weight_bytes` at the method's packing.
    """
    size, cfg, quant, stored = DTYPE_BYTES[dtype], ckpt.config_path, ckpt.quantization, ckpt.stored
    estimate = checkpoint.estimate_parameters(ckpt.text, ckpt.vision)
    expected = estimate * size if quant is None else checkpoint.weight_bytes(ckpt.text, ckpt.vision, size, quant)
    if stored is not None and stored.bytes < expected * MIN_STORED_SHARE:
        raise ModelError(
            f"{stored.source}: {stored.bytes:,} bytes of weights, under {MIN_STORED_SHARE:.0%} of the "
            f"{expected:,} that {cfg}'s sizes imply: a truncated or placeholder checkpoint"
        )
    if quant is None and stored is not None:
        return stored.bytes // size, stored.bytes, f"{stored.source} / {size} ({dtype})", stored.source
    if quant is None:
        counted = f"estimated from {cfg} (embeddings + layers + vision blocks; no weight files)"
        return estimate, 0, counted, f"parameters x {size} B ({dtype}); no weight files"
    counted = f"estimated from {cfg} (unquantized count: embeddings + layers + vision blocks)"
    if stored is not None:
        return estimate, stored.bytes, counted, f"{stored.source} ({quant.describe()}, as stored)"
    where = (
        f"estimated from {cfg} {ckpt.key('quantization_config')}: {quant.describe()} decoder linears "
        f"(vLLM's packed tensors), embeddings/lm_head/vision in {dtype}; no weight files"
    )
    return estimate, expected, counted, where


def _spec_weights(ckpt: checkpoint.Checkpoint, dtype: str, dtype_source: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The weight fields of a local spec (``parameters``, ``weight_bytes``, ``quantization``,
    ``dtype``) and their ``sources`` entries."""
    parameters, weights, parameters_source, weights_source = _weights(ckpt, dtype)
    quant = ckpt.quantization.quant_method if ckpt.quantization else ""
    quant_source = f"{ckpt.config_path} {ckpt.key('quantization_config')}.quant_method"
    fields = {"parameters": parameters, "weight_bytes": weights, "quantization": quant, "dtype": dtype}
    return fields, {
        "parameters": parameters_source,
        "weight_bytes": weights_source,
        "dtype": dtype_source,
        "quantization": quant_source if quant else f"{ckpt.config_path}: no quantization_config",
    }


def _dtype(ckpt: checkpoint.Checkpoint, default: str, default_from: str) -> tuple[str, str]:
    """The checkpoint's dtype and its source; ``default`` (``default_from``'s) where config.json has none."""
    if ckpt.dtype is not None:
        return ckpt.dtype, f"{ckpt.config_path} {ckpt.dtype_key}"
    return default, f"{ckpt.config_path} has no torch_dtype/dtype; {default_from} default"


def _pixel_bounds(ckpt: checkpoint.Checkpoint, template: ModelSpec) -> tuple[int | None, int | None, str]:
    """``min_pixels``, ``max_pixels`` and their source: the folder's preprocessor config, the
    template's where it gives none or the template tiles pages itself.

    Raises:
        ModelError: the combined bounds cross (``min_pixels`` above ``max_pixels``).
    """
    pre = ckpt.pixels
    if template.token_formula == TILES or pre is None:
        why = "the processor tiles pages" if template.token_formula == TILES else f"{checkpoint.PREPROCESSOR} absent"
        return template.min_pixels, template.max_pixels, f"{template.id} defaults ({why})"
    lo, hi = pre.min_pixels or template.min_pixels, pre.max_pixels or template.max_pixels
    if lo is not None and hi is not None and lo > hi:
        raise ModelError(f"{pre.source}: min_pixels {lo} exceeds max_pixels {hi} (missing bounds: {template.id}'s)")
    return lo, hi, pre.source


def _vision_spec(ckpt: checkpoint.Checkpoint, template: ModelSpec) -> ModelSpec:
    """A VLM folder: numbers from its files, the recipe of the registry entry of its ``model_type``.

    Raises:
        ModelError: no ``vision_config`` (the encoder's weights and activation would be left out).
    """
    text, vision, cfg = ckpt.text, ckpt.vision, str(ckpt.config_path)
    if "vision_config" not in ckpt.top_keys:
        raise ModelError(f"{cfg}: vision_config: missing; a {ckpt.model_type} checkpoint has a vision encoder")
    fields = checkpoint.text_fields(text, template.max_position_embeddings)
    if text.intermediate_size is None:
        fields["intermediate_size"] = template.intermediate_size
    weights, weight_sources = _spec_weights(ckpt, *_dtype(ckpt, template.dtype, template.id))
    lo, hi, pixel_source = _pixel_bounds(ckpt, template)
    vision_fields = {
        "vision_hidden_size": vision.width or template.vision_hidden_size,
        "vision_intermediate_size": vision.intermediate_size or template.vision_intermediate_size,
        "patch_size": vision.patch_size or template.patch_size,
        "merge_size": vision.spatial_merge_size or template.merge_size,
    }
    return template.with_overrides(
        id=str(ckpt.folder),
        min_pixels=lo,
        max_pixels=hi,
        sources={
            **template.sources,
            **dict.fromkeys([*fields, *vision_fields], cfg),
            **weight_sources,
            "min_pixels": pixel_source,
            "max_pixels": pixel_source,
        },
        notes=f"local checkpoint ({ckpt.model_type}); recipe from {template.id}",
        **fields,
        **vision_fields,
        **weights,
    )


TEXT_MIN_VLLM = "0.9.1"
"""The lowest vLLM a plain decoder needs, as far as the planner goes (see its source in the spec)."""
TEXT_RECIPE_KEYS = (
    "prompts",
    "sampling",
    "retry_sampling",
    "prompt_prefix",
    "system_prompt",
    "image_first",
)
"""Fields (and sources) a text-only local spec takes from the :data:`DEFAULT_MODEL` entry."""
TEXT_VLLM_FLAGS = ("--no-enable-prefix-caching",)
"""``vllm serve`` flags of a text-only local spec: the registry's single-use-page flag, without the
multimodal ones (``--mm-processor-cache-gb``)."""


def _text_spec(ckpt: checkpoint.Checkpoint) -> ModelSpec:
    """A plain decoder folder (:data:`ocrserve.models.checkpoint.TEXT_DECODERS`) as a text-only spec:
    no visual tokens, vision sizes 0, the :data:`DEFAULT_MODEL` recipe (its prompts and sampling,
    ``max_tokens`` included), so the planner's memory terms can be checked against its start-up."""
    template, cfg = REGISTRY[DEFAULT_MODEL], str(ckpt.config_path)
    fields = checkpoint.text_fields(ckpt.text, template.max_position_embeddings)
    weights, weight_sources = _spec_weights(ckpt, *_dtype(ckpt, "bfloat16", "vLLM's half-precision"))
    none = "text-only: no vision encoder"
    notes = [
        f"local checkpoint ({ckpt.model_type}), planned as text-only: it has no vision encoder and cannot OCR "
        f"page images; prompts and sampling from {template.id}"
    ]
    if ckpt.text.window:
        notes.append(
            f"{ckpt.key('sliding_window')} {ckpt.text.window} tokens: attention looks back that far; not "
            "modelled, the KV cache is planned for full attention"
        )
    if ckpt.text.max_position_embeddings is None:
        notes.append(f"no max_position_embeddings: {template.id}'s {template.max_position_embeddings} assumed")
    return template.with_overrides(
        id=str(ckpt.folder),
        architecture=ckpt.model_type,
        **fields,
        **weights,
        vision_hidden_size=0,
        vision_intermediate_size=0,
        patch_size=1,
        merge_size=1,
        min_pixels=None,
        max_pixels=None,
        token_formula=TEXT,
        tiles={},
        row_tokens=0,
        image_tokens=0,
        profile_image=None,
        postprocess="",
        vllm_flags=TEXT_VLLM_FLAGS,
        min_vllm=TEXT_MIN_VLLM,
        sources={
            **{k: f"{template.id}: {v}" for k, v in template.sources.items() if k in TEXT_RECIPE_KEYS},
            **dict.fromkeys(fields, cfg),
            **weight_sources,
            **dict.fromkeys(["vision_hidden_size", "vision_intermediate_size", "patch_size", "merge_size"], none),
            "min_pixels": "text-only: no image input",
            "max_pixels": "text-only: no image input",
            "token_formula": f"text-only: {cfg} model_type {ckpt.model_type!r} has no vision encoder (0 visual tokens)",
            "vllm_flags": "ocrserve: prefix caching off as in every registry recipe (single-use pages); "
            "no multimodal flags",
            "min_vllm": "llama, mistral and qwen2 are in every vLLM V1 release; qwen3 since 0.8.4, before the "
            "first release the planner follows (0.9.1)",
        },
        notes="; ".join(notes),
    )


def from_local(folder: str | Path) -> ModelSpec:
    """Build a spec from a local checkpoint folder (:func:`ocrserve.models.checkpoint.read_checkpoint`).

    Numbers come from the folder: decoder sizes from ``config.json`` (flat or under
    ``text_config``/``language_config``/``llm_config``), vision sizes from ``vision_config``, the pixel
    bounds from ``preprocessor_config.json``, the weights from ``model.safetensors.index.json``
    (``metadata.total_size``), the safetensors file sizes or failing both an estimate from the config
    (at the ``quantization_config`` packing where there is one); the parameters from the stored bytes /
    dtype bytes when unquantized, else from the config. A VLM takes prompts, sampling and flags from
    the registry entry of the same ``model_type``; a plain decoder (``llama``, ``mistral``, ``qwen2``,
    ``qwen3``) becomes a text-only spec (:data:`TEXT`) with the :data:`DEFAULT_MODEL` recipe.

    Raises:
        ModelError: no ``config.json``, an unsupported ``model_type``, or any missing or invalid field
            of the folder's files (the message names the file and the key path).
    """
    supported = {*BY_ARCHITECTURE, *checkpoint.TEXT_DECODERS}
    ckpt = checkpoint.read_checkpoint(folder, supported)
    template = BY_ARCHITECTURE.get(ckpt.model_type)
    return _text_spec(ckpt) if template is None else _vision_spec(ckpt, template)
