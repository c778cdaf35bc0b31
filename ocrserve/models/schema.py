"""The registry data files: their shape, their validation and how they become :class:`ModelSpec`.

One YAML file per model under ``ocrserve/models/registry/`` (package data, read with
:mod:`importlib.resources`, so it works from a wheel). Identity keys are plain values; every number,
prompt, flag and formula is a *cited value*, a mapping ``{value: ..., source: "..."}``::

    id: tencent/HunyuanOCR                  # Hugging Face id
    order: 1                                # position in `ocrserve models` and error listings
    architecture: hunyuan_vl                # config.json model_type family
    template_for: [hunyuan_vl]              # local checkpoints of these model_types take this recipe
    patch_size:
      value: 16
      source: https://huggingface.co/tencent/HunyuanOCR/blob/main/config.json vision_config.patch_size=16
    ...

An entry may derive from another with ``base: <id>`` (olmOCR-2 is a full fine-tune of
Qwen2.5-VL-7B-Instruct): it inherits every key it does not name except ``id``, ``order`` and
``template_for``; a cited key that gives only ``source`` keeps the base's value with a new citation,
one that gives ``value`` must give its ``source`` too. ``image_first``, ``system_prompt`` and
``notes`` may be plain values (the model cards state them without a number to cite).

Validation is pydantic's (strict types, unknown keys refused); any problem is a
:class:`RegistryError` naming the file and the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from ocrserve.models.spec import TASKS, TILES, ModelError, ModelSpec

if TYPE_CHECKING:
    from importlib.abc import Traversable

T = TypeVar("T")

REGISTRY_DIR: Traversable = files("ocrserve.models") / "registry"
"""The shipped registry entries, one ``*.yaml`` per model."""
NOT_INHERITED = ("id", "order", "base", "template_for")
"""Keys a derived entry never takes from its base."""

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class RegistryError(ModelError):
    """A registry data file is unreadable or invalid; the message names the file and the key."""


class Cited(BaseModel, Generic[T]):
    """A value and where it comes from (model card, ``config.json``, vLLM source or recipe, paper)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    value: T
    source: str = Field(min_length=1)

    @field_validator("source")
    @classmethod
    def _not_blank(cls, source: str) -> str:
        if not source.strip():
            raise ValueError("source must not be blank")
        return source


class Tiles(BaseModel):
    """DeepSeek-OCR's tiling constants: queries per side of the global view and of a tile, the tile
    side (px) and the range of tiles per page."""

    model_config = ConfigDict(extra="forbid", strict=True)

    base_queries: PositiveInt
    tile_queries: PositiveInt
    tile_size: PositiveInt
    min_crops: PositiveInt
    max_crops: PositiveInt


class Speculative(BaseModel):
    """A speculative decoder the model ships: vLLM's ``--speculative-config`` keys (``method``,
    ``model``, ``num_speculative_tokens``: ``vllm/config/speculative.py`` ``SpeculativeConfig``),
    what it adds to memory (``parameters`` of a separate draft, 0 for heads already in the
    checkpoint; ``kv_layers``: layers keeping K and V per token) and its reported
    ``speedup`` as ``[concurrency, factor]`` pairs."""

    model_config = ConfigDict(extra="forbid", strict=True)

    method: Literal["dflash", "mtp", "eagle", "eagle3", "draft_model"]
    model: str | None = None
    num_speculative_tokens: PositiveInt
    parameters: NonNegativeInt = 0
    kv_layers: NonNegativeInt = 0
    speedup: list[list[float]] = []

    @field_validator("speedup")
    @classmethod
    def _pairs(cls, speedup: list[list[float]]) -> list[list[float]]:
        for pair in speedup:
            if len(pair) != 2 or pair[0] < 1 or pair[1] <= 0:
                raise ValueError(f"speedup: needs [concurrency >= 1, factor > 0] pairs, got {pair}")
        return speedup


class RegistryEntry(BaseModel):
    """One registry file after ``base:`` is resolved; the fields of :class:`ModelSpec`, cited."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = Field(min_length=1, pattern=r"^[^/\s]+/[^/\s]+$")
    order: int | None = None
    base: str | None = None
    architecture: str = Field(min_length=1)
    template_for: list[str] = []
    parameters: Cited[PositiveInt]
    dtype: Cited[Literal["bfloat16", "float16", "float32"]]
    num_layers: Cited[PositiveInt]
    num_attention_heads: Cited[PositiveInt]
    num_kv_heads: Cited[PositiveInt]
    head_dim: Cited[PositiveInt]
    hidden_size: Cited[PositiveInt]
    intermediate_size: Cited[PositiveInt]
    vocab_size: Cited[PositiveInt]
    max_position_embeddings: Cited[PositiveInt]
    vision_hidden_size: Cited[PositiveInt]
    vision_intermediate_size: Cited[PositiveInt]
    patch_size: Cited[PositiveInt]
    merge_size: Cited[PositiveInt]
    min_pixels: Cited[PositiveInt | None]
    max_pixels: Cited[PositiveInt | None]
    token_formula: Cited[Literal["grid", "tiles"]]
    row_tokens: Cited[NonNegativeInt] | None = None
    image_tokens: Cited[NonNegativeInt] | None = None
    profile_image: Cited[list[PositiveInt]] | None = None
    tiles: Cited[Tiles] | None = None
    prompts: Cited[dict[str, str]]
    prompt_prefix: Cited[str] | None = None
    system_prompt: Cited[str | None] | str | None = None
    image_first: Cited[bool] | bool = True
    sampling: Cited[dict[str, Any]]
    retry_sampling: Cited[dict[str, Any]] | None = None
    postprocess: Cited[str] | None = None
    vllm_flags: Cited[list[str]]
    min_vllm: Cited[str]
    output_tokens: Cited[dict[str, Any]] | None = None
    speculative: Cited[Speculative] | None = None
    notes: str = ""

    @field_validator("output_tokens")
    @classmethod
    def _length_prior(cls, prior: Cited[dict[str, Any]] | None) -> Cited[dict[str, Any]] | None:
        if prior is None:
            return prior
        for task, figures in prior.value.items():
            if task == "runaway":
                if not isinstance(figures, float) or not 0 <= figures < 1:
                    raise ValueError(f"output_tokens: runaway must be a share in [0, 1), got {figures!r}")
                continue
            if task not in TASKS:
                raise ValueError(f"output_tokens: unknown task {task!r}; tasks: {', '.join(TASKS)}")
            if (
                not isinstance(figures, dict)
                or set(figures) != {"median", "p95"}
                or not all(isinstance(v, int) and v > 0 for v in figures.values())
                or figures["p95"] <= figures["median"]
            ):
                raise ValueError(f"output_tokens: {task} needs positive integers median < p95, got {figures!r}")
        return prior

    @field_validator("prompts")
    @classmethod
    def _every_task(cls, prompts: Cited[dict[str, str]]) -> Cited[dict[str, str]]:
        if set(prompts.value) != set(TASKS) or not all(p.strip() for p in prompts.value.values()):
            raise ValueError(
                f"prompts: needs exactly the tasks {', '.join(TASKS)}, each non-empty; got {sorted(prompts.value)}"
            )
        return prompts

    @field_validator("sampling")
    @classmethod
    def _max_tokens_set(cls, sampling: Cited[dict[str, Any]]) -> Cited[dict[str, Any]]:
        value = sampling.value.get("max_tokens")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"sampling: max_tokens must be a positive integer, got {value!r}")
        return sampling

    @field_validator("profile_image")
    @classmethod
    def _height_width(cls, image: Cited[list[int]] | None) -> Cited[list[int]] | None:
        if image is not None and len(image.value) != 2:
            raise ValueError(f"profile_image: needs [height, width] in px, got {image.value}")
        return image

    @model_validator(mode="after")
    def _formula_fits(self) -> RegistryEntry:
        lo, hi = self.min_pixels.value, self.max_pixels.value
        if self.token_formula.value == TILES:
            if self.tiles is None:
                raise ValueError("tiles: required when token_formula is 'tiles'")
            if lo is not None or hi is not None:
                raise ValueError(
                    "min_pixels/max_pixels: must be null for token_formula 'tiles' (the processor tiles pages itself)"
                )
            if self.tiles.value.min_crops > self.tiles.value.max_crops:
                raise ValueError("tiles: min_crops exceeds max_crops")
            return self
        if self.tiles is not None:
            raise ValueError("tiles: only for token_formula 'tiles'")
        if lo is None or hi is None:
            raise ValueError("min_pixels/max_pixels: required for token_formula 'grid'")
        if lo > hi:
            raise ValueError(f"min_pixels {lo:,} exceeds max_pixels {hi:,}")
        return self

    def to_spec(self) -> ModelSpec:
        """The :class:`ModelSpec` with ``sources`` gathered from the citations."""
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name in type(self).model_fields:
            if name in ("order", "base", "template_for"):
                continue
            item = getattr(self, name)
            if item is None:
                continue
            if isinstance(item, Cited):
                sources[name] = item.source
                item = item.value
            values[name] = item
        values["vllm_flags"] = tuple(values["vllm_flags"])
        if "profile_image" in values:
            values["profile_image"] = tuple(values["profile_image"])
        if "tiles" in values:
            values["tiles"] = values["tiles"].model_dump()
        if "speculative" in values:
            values["speculative"] = values["speculative"].model_dump()
        return ModelSpec(**values, sources=sources)


@dataclass(frozen=True)
class Registry:
    """The loaded registry.

    Attributes:
        specs: Hugging Face id -> spec, in ``order``.
        by_architecture: ``config.json`` ``model_type`` -> the spec whose recipe a local checkpoint
            of that type takes (from the entries' ``template_for``).
        files: Hugging Face id -> the file it came from.
    """

    specs: dict[str, ModelSpec]
    by_architecture: dict[str, ModelSpec]
    files: dict[str, str]


def _describe(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("Cited[", "function-")))
        if err["type"] == "value_error":
            msg = str(err["ctx"]["error"])
        elif err["type"] == "model_type" and "Cited[" in err["msg"]:
            msg = f"expected a cited value {{value: ..., source: ...}}, got {err['input']!r}"
        else:
            msg = err["msg"]
        problems.append(f"{loc}: {msg}" if loc and not msg.startswith(loc + ":") else msg)
    return "; ".join(problems)


def _read(file: Traversable) -> dict:
    try:
        data = yaml.load(file.read_text(encoding="utf-8"), Loader=_Loader)
    except (OSError, UnicodeDecodeError) as exc:
        raise RegistryError(f"{file}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise RegistryError(f"{file}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise RegistryError(f"{file}: a registry entry must be a mapping of keys, got {type(data).__name__}")
    if not isinstance(data.get("id"), str):
        raise RegistryError(f"{file}: id: required, the model's Hugging Face id")
    return data


def _merge(base: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """``child`` over ``base``: see the module docstring for the rules."""
    merged = {k: v for k, v in base.items() if k not in NOT_INHERITED}
    for key, value in child.items():
        old = merged.get(key)
        if isinstance(value, dict) and set(value) == {"source"} and isinstance(old, dict) and "value" in old:
            value = {"value": old["value"], "source": value["source"]}
        merged[key] = value
    return merged


def load_registry(folder: Traversable | Path | str | None = None) -> Registry:
    """Load and validate every ``*.yaml`` entry in ``folder`` (default: the shipped :data:`REGISTRY_DIR`).

    Raises:
        RegistryError: unreadable YAML, an unknown or missing key, a value of the wrong type or
            range, a missing or blank source, an unknown or circular ``base``, a duplicate ``id``
            or ``template_for``; the message names the file and the key.
    """
    root: Traversable = REGISTRY_DIR if folder is None else (Path(folder) if isinstance(folder, str) else folder)
    found = sorted((f for f in root.iterdir() if f.name.endswith(".yaml") and f.is_file()), key=lambda f: f.name)
    raw: dict[str, tuple[Traversable, dict]] = {}
    for file in found:
        data = _read(file)
        if data["id"] in raw:
            raise RegistryError(f"{file}: id: {data['id']!r} is also the id of {raw[data['id']][0]}")
        raw[data["id"]] = (file, data)

    resolved: dict[str, dict] = {}

    def resolve(model_id: str, chain: tuple[str, ...] = ()) -> dict:
        file, data = raw[model_id]
        if model_id in resolved:
            return resolved[model_id]
        base = data.get("base")
        if base is None:
            merged = dict(data)
        else:
            if base not in raw:
                raise RegistryError(f"{file}: base: unknown entry {base!r}; known: {', '.join(raw)}")
            if base in chain or base == model_id:
                raise RegistryError(f"{file}: base: circular derivation {' -> '.join((*chain, model_id, base))}")
            merged = _merge(resolve(base, (*chain, model_id)), data)
        resolved[model_id] = merged
        return merged

    entries: list[tuple[RegistryEntry, str]] = []
    # entries of their own first, so a broken base is named before the entries deriving from it
    for model_id, (file, _) in sorted(raw.items(), key=lambda item: item[1][1].get("base") is not None):
        try:
            entries.append((RegistryEntry.model_validate(resolve(model_id)), str(file)))
        except ValidationError as exc:
            raise RegistryError(f"{file}: {_describe(exc)}") from None
    entries.sort(key=lambda e: (e[0].order is None, e[0].order or 0, e[1]))

    specs = {entry.id: entry.to_spec() for entry, _ in entries}
    by_architecture: dict[str, ModelSpec] = {}
    owner: dict[str, str] = {}
    for entry, file in entries:
        for kind in entry.template_for:
            if kind in owner:
                raise RegistryError(f"{file}: template_for: {kind!r} is already taken by {owner[kind]}")
            by_architecture[kind], owner[kind] = specs[entry.id], file
    return Registry(specs, by_architecture, {entry.id: file for entry, file in entries})
