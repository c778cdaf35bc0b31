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
from its own files and takes the recipe from the registry entry of the same architecture.
"""

from __future__ import annotations

import json
from pathlib import Path

from ocrserve.models.schema import Registry, RegistryError, load_registry
from ocrserve.models.spec import CHAT_TEMPLATE_TOKENS, DTYPE_BYTES, GRID, TASKS, TILES, ModelError, ModelSpec

__all__ = [
    "BY_ARCHITECTURE",
    "CHAT_TEMPLATE_TOKENS",
    "DEFAULT_MODEL",
    "DTYPE_BYTES",
    "GRID",
    "REGISTRY",
    "TASKS",
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
    if (path / "config.json").is_file():
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
    template = BY_ARCHITECTURE.get(kind)
    if template is None:
        raise ModelError(
            f"{config_path}: model_type {kind!r} is not supported; supported: {', '.join(sorted(BY_ARCHITECTURE))}"
        )
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
        found = (
            estimate_parameters(text, vision),
            f"estimated from {config_path} (embeddings + layers + vision blocks; no weight files)",
        )
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
            **dict.fromkeys(
                list(fields) + ["dtype", "vision_hidden_size", "vision_intermediate_size", "patch_size", "merge_size"],
                cfg_src,
            ),
            "parameters": found[1],
            "min_pixels": pixel_source,
            "max_pixels": pixel_source,
        },
        notes=f"local checkpoint ({kind}); recipe from {template.id}",
        **fields,
    )
