"""The debug engine: the OCR model in plain PyTorch with transformers' own classes, one page at a time.

When a page comes out wrong in production, this engine tells a model problem from a serving one:
it gets the same page from the same preprocessor and sends the model the same request the ``vllm``
engine sends (:func:`ocrserve.engines.chat.page_recipe`: messages, prompt, image as a PNG/JPEG
``data:`` URI, the registry's sampling), then reads the reply the same way
(:func:`~ocrserve.engines.chat.reply_result`).

Loading (in :meth:`TransformersEngine.start`, on the engine's one thread): ``AutoProcessor`` and
``AutoModelForImageTextToText`` (which maps ``hunyuan_vl`` to ``HunYuanVLForConditionalGeneration``),
``local_files_only=True`` (a local folder, or a model already in the Hugging Face cache; nothing is
downloaded), on ``engine.transformers.device`` in its ``dtype`` with its ``attn_implementation``,
then one warm-up page before ``ready``.

Generation (transformers' generation docs, ``GenerationConfig`` and ``StoppingCriteria``): greedy
unless the recipe samples, ``max_new_tokens`` always set, the card's ``repetition_penalty``, and
two stopping criteria: a wall-clock cap per page (``engine.transformers.page_timeout_s``, or the
page's deadline when nearer) and HunyuanOCR's tail-repetition rule (``engine.repeat_guard``, the
rule the ``vllm`` engine applies to its streamed replies). A page a guard cut is a result, not an
error: its ``generation.finish_reason`` says which guard fired (``stop``: EOS, ``length``:
max_new_tokens, ``time``, ``repetition``). A running prefill cannot be interrupted; the pixel budget bounds it.

Exactly one slot and one thread: pages run one after another, a second page waits in the router.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import resource
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub import try_to_load_from_cache
from transformers import (
    AttentionInterface,
    AutoModelForImageTextToText,
    AutoProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer
from transformers.utils import logging as hf_logging

from ocrserve.config import Config, RepeatGuardConfig
from ocrserve.engines.base import Engine, PageError
from ocrserve.engines.chat import RepeatWatch, image_data_uri, page_recipe, reply_result, retry_sampling
from ocrserve.errors import DeadlinePassed
from ocrserve.models import ModelError, ModelSpec, get_model
from ocrserve.pages import Page, PageResult
from ocrserve.work import Deadline

log = logging.getLogger(__name__)

#: Recipe keys (vLLM spelling) that ``generate`` has no counterpart for; the engine logs them and
#: ``/v1/models`` lists them as ``sampling_not_applied``.
UNMAPPED_SAMPLING = ("presence_penalty", "frequency_penalty", "vllm_xargs")
#: Output tokens of the warm-up page.
WARM_UP_TOKENS = 2
#: Weight files ``from_pretrained`` loads from a folder (safetensors, sharded or not, or PyTorch's).
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")


def generate_kwargs(sampling: Mapping[str, object], max_new_tokens: int | None = None) -> dict:
    """``model.generate`` keyword arguments for a recipe's vLLM-spelled sampling.

    ``temperature`` 0 is greedy (``do_sample=False``; ``top_p``/``top_k`` are then moot and left
    out, as HF warns about them); above 0 it samples with ``temperature``, ``top_p`` and ``top_k``
    (vLLM's ``-1`` = off). ``repetition_penalty`` passes as is (HF applies it to the prompt's ids
    too, as vLLM does). ``max_tokens`` becomes ``max_new_tokens`` unless ``max_new_tokens`` is
    given. ``skip_special_tokens`` is for decoding, not here; :data:`UNMAPPED_SAMPLING` has no
    counterpart.
    """
    temperature = float(sampling.get("temperature", 1.0))
    kwargs: dict = {"max_new_tokens": max_new_tokens or int(sampling["max_tokens"]), "do_sample": temperature > 0}
    if temperature > 0:
        kwargs["temperature"] = temperature
        kwargs["top_p"] = float(sampling.get("top_p", 1.0))
        if int(sampling.get("top_k", -1)) > 0:
            kwargs["top_k"] = int(sampling["top_k"])
    if "repetition_penalty" in sampling:
        kwargs["repetition_penalty"] = float(sampling["repetition_penalty"])
    return kwargs


def resolve_device(name: str) -> torch.device:
    """``auto`` = ``cuda`` when torch sees a GPU, else ``cpu``; any other name as torch spells it.

    Raises:
        ValueError: a name torch does not know, a CUDA device torch cannot see, or a device whose
            backend this torch build lacks (``mps`` off a Mac): a one-element tensor is made on it.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"engine.transformers.device={name!r}: {exc}") from None
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        seen = f"{torch.cuda.device_count()} CUDA device(s)" if torch.version.cuda else "no CUDA (a CPU-only build)"
        raise ValueError(f"engine.transformers.device={name!r}: torch {torch.__version__} sees {seen}")
    try:
        torch.empty(1, device=device)  # mps, xpu ...: torch knows the name but may lack the backend
    except (RuntimeError, AssertionError) as exc:
        first = str(exc).split(". ")[0].splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(
            f"engine.transformers.device={name!r}: torch {torch.__version__} cannot use it: {first}"
        ) from None
    return device


def check_attention(name: str) -> None:
    """Refuse an ``attn_implementation`` transformers does not register (``AttentionInterface``'s
    mapping, the registry ``from_pretrained`` resolves names in; ``eager`` is built in), or a
    flash-attention one whose package is not installed.

    Raises:
        ValueError: the message names the key.
    """
    known = {"eager", *(key for key in AttentionInterface._global_mapping if "|" not in key)}
    if name not in known:
        raise ValueError(
            f"engine.transformers.attn_implementation={name!r}: transformers knows {', '.join(sorted(known))}"
        )
    package = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}.get(name)
    if package and importlib.util.find_spec(package) is None:
        raise ValueError(f"engine.transformers.attn_implementation={name}: the {package} package is not installed")


def locate_weights(source: str, spec: ModelSpec) -> str:
    """Where ``from_pretrained`` finds ``source``'s files without downloading: the local folder
    :func:`~ocrserve.models.get_model` read ``spec`` from, or the model's Hugging Face id when the
    Hugging Face cache holds it.

    Raises:
        ValueError: a folder without weight files, or a registry model the cache does not hold.
    """
    path = Path(source).expanduser()
    if (path / "config.json").is_file():
        if not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES):
            raise ValueError(f"engine.model={source!r}: the folder holds no weights ({', '.join(WEIGHT_FILES)})")
        return str(path)
    if not isinstance(try_to_load_from_cache(spec.id, "config.json"), str):
        raise ValueError(
            f"engine.model={source!r}: {spec.id} is not in the Hugging Face cache ({hf_constants.HF_HUB_CACHE}) and "
            f"nothing is downloaded at run time; fetch it first (`hf download {spec.id}`) or pass a local folder"
        )
    return spec.id


def resolve_dtype(name: str, device: torch.device, spec: ModelSpec) -> torch.dtype:
    """``auto`` = the checkpoint's dtype (the registry's) on a GPU, float32 on a CPU, where bfloat16
    matmuls are several times slower; any other name as torch spells it."""
    if name == "auto":
        name = spec.dtype if device.type == "cuda" else "float32"
    return getattr(torch, name)


class RepetitionGuard(StoppingCriteria):
    """Stops a reply whose tail repeats (HunyuanOCR's batch-client rule, thresholds from ``cfg``).

    The reply is detokenized as it grows (a token whose bytes end mid-character waits for the next
    one) and checked by :class:`~ocrserve.engines.chat.RepeatWatch`, the rule the ``vllm`` engine
    applies to its streamed replies. One row (batch size 1).
    """

    def __init__(self, cfg: RepeatGuardConfig, tokenizer, prompt_len: int):
        self.tokenizer = tokenizer
        self.read = prompt_len
        self.text = ""
        self.watch = RepeatWatch(cfg)

    @property
    def fired(self) -> bool:
        return self.watch.fired

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        piece = self.tokenizer.decode(input_ids[0, self.read :], skip_special_tokens=True)
        if not piece.endswith("\ufffd"):
            self.text += piece
            self.read = input_ids.shape[1]
        fired = self.watch.check(self.text)
        return torch.full((input_ids.shape[0],), fired, dtype=torch.bool, device=input_ids.device)


class WallClockCap(StoppingCriteria):
    """Stops generation once ``time.monotonic()`` passes ``deadline`` or ``cancel`` is set (the page
    was cancelled). Checked after every decoding step, like transformers' ``MaxTimeCriteria``."""

    def __init__(self, deadline: float, cancel: threading.Event):
        self.deadline, self.cancel = deadline, cancel
        self.fired = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.fired = self.cancel.is_set() or time.monotonic() > self.deadline
        return torch.full((input_ids.shape[0],), self.fired, dtype=torch.bool, device=input_ids.device)


class StepClock(BaseStreamer):
    """``generate`` calls ``put`` with the prompt, then once per new token: prefill ends at the first
    token's ``put``, decoding at ``end``. Times are ``time.perf_counter()`` seconds."""

    def __init__(self) -> None:
        self.puts: list[float] = []
        self.ended = 0.0

    def put(self, value) -> None:
        self.puts.append(time.perf_counter())

    def end(self) -> None:
        self.ended = time.perf_counter()


@dataclass
class Generation:
    """One page's decoding: the reply and how it went.

    Attributes:
        reply: the decoded new tokens (``skip_special_tokens`` as the recipe says).
        finish_reason: ``stop``, ``length``, ``time`` or ``repetition``.
        prompt_tokens, image_tokens, new_tokens: counts.
        processor_s, prefill_s, decode_s: seconds in the processor (chat template, image
            decoding and patching), up to the first new token, and after it.
        tokens_per_s: decoding speed after the first token (0 with fewer than 2 tokens).
        started_at, ended_at: Unix time the page's work began and ended on the engine thread, s.
        retried: the reply is the second attempt, after the first was cut by ``max_new_tokens``.
        first_try_s: seconds of that first attempt (0 when not retried).
    """

    reply: str
    finish_reason: str
    prompt_tokens: int
    image_tokens: int
    new_tokens: int
    processor_s: float
    prefill_s: float
    decode_s: float
    tokens_per_s: float
    started_at: float
    ended_at: float
    retried: bool = False
    first_try_s: float = 0.0

    @property
    def seconds(self) -> float:
        """Processor, prefill and decoding time of this generation, s."""
        return self.processor_s + self.prefill_s + self.decode_s

    def after(self, first: Generation) -> Generation:
        """This generation as the retry of ``first``: its reply, counts, stage times and tokens/s,
        with ``first``'s start and its whole time as ``first_try_s`` (so the page's ``engine_s``
        covers both)."""
        return replace(self, started_at=first.started_at, retried=True, first_try_s=first.seconds)

    def report(self) -> dict:
        """``PageResult.generation``: the reason (and, as the ``vllm`` engine reports them,
        ``truncated``, here for a cut by ``max_new_tokens`` or by the wall-clock cap, and
        ``retried``), the counts, tokens/s and the instants."""
        return {
            "finish_reason": self.finish_reason,
            "truncated": self.finish_reason in ("length", "time"),
            "retried": self.retried,
            "prompt_tokens": self.prompt_tokens,
            "image_tokens": self.image_tokens,
            "new_tokens": self.new_tokens,
            "tokens_per_s": round(self.tokens_per_s, 1),
            "started_at": round(self.started_at, 4),
            "ended_at": round(self.ended_at, 4),
        }


class TransformersEngine(Engine):
    """OCR with the model in PyTorch, one page at a time (see the module docstring).

    Args:
        config: the profile; ``engine.model`` (a registry id or a local folder) picks the model
            and its recipe, ``engine.transformers`` the device and guards, ``engine.vllm`` the
            task and image encoding (the request the ``vllm`` engine would send).

    Raises:
        ValueError: a model the registry cannot serve, weights not on this machine, or a device
            torch cannot use (the message names the key).
    """

    def __init__(self, config: Config):
        super().__init__()
        self.cfg = config.engine.transformers
        self.repeat_guard = config.engine.repeat_guard
        self.recipe = config.engine.vllm
        self.source = config.engine.model
        try:
            self.spec = get_model(self.source)
        except ModelError as exc:
            raise ValueError(f"engine.model: {exc}") from None
        self.model = self.spec.id
        self.weights = locate_weights(self.source, self.spec)
        self.unmapped = [key for key in UNMAPPED_SAMPLING if key in self.spec.sampling]
        self.sampling = generate_kwargs(
            self.spec.sampling, None if self.cfg.max_new_tokens == "auto" else self.cfg.max_new_tokens
        )
        check_attention(self.cfg.attn_implementation)
        self.device = resolve_device(self.cfg.device)
        self.dtype = resolve_dtype(self.cfg.dtype, self.device, self.spec)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ocrserve-torch")
        self._processor = None
        self._net = None
        self.parameters = 0

    @property
    def slots(self) -> int:
        return 1

    async def start(self) -> None:
        """Load the processor and model on the engine thread, run one warm-up page, set ``ready``.

        Raises:
            ValueError: the checkpoint lacks a file, or transformers has no image-text-to-text
                class for it.
        """
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._load)
        await loop.run_in_executor(self._thread, self._warm_up)
        self.ready = True

    async def close(self) -> None:
        self.ready = False
        self._thread.shutdown(wait=True, cancel_futures=True)

    def describe(self) -> dict:
        """``GET /v1/models`` entry: the base fields plus device, dtype, parameters and guards."""
        return super().describe() | {
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "parameters": self.parameters,
            "class": type(self._net).__name__ if self._net is not None else None,
            "attn_implementation": self.cfg.attn_implementation,
            "threads": torch.get_num_threads() if self.device.type == "cpu" else None,
            "max_new_tokens": self.sampling["max_new_tokens"],
            "page_timeout_s": self.cfg.page_timeout_s,
            "sampling_not_applied": self.unmapped,
        }

    def peak_memory(self) -> tuple[str, int]:
        """The peak memory so far, bytes, and what was measured: ``cuda`` (torch's
        ``max_memory_allocated`` on the engine's GPU) or, on a CPU, ``rss`` (this process's peak
        resident set, ``getrusage``'s ``ru_maxrss``: KiB on Linux, bytes on macOS)."""
        if self.device.type == "cuda":
            return "cuda", int(torch.cuda.max_memory_allocated(self.device))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return "rss", int(rss if sys.platform == "darwin" else rss * 1024)

    def request(self, page: Page) -> dict:
        """The page's :func:`~ocrserve.engines.chat.page_recipe`, built exactly as the ``vllm`` engine
        builds it (same task, image encoding and sampling)."""
        uri = image_data_uri(page.image, self.recipe.image_format, self.recipe.jpeg_quality)
        return page_recipe(self.spec, self.recipe.task, uri)

    async def ocr_page(self, page: Page, *, priority: int = 0, deadline: Deadline | None = None) -> PageResult:
        """OCR one page on the engine thread. See :class:`Engine` and the module docstring.

        Generation stops at ``engine.transformers.page_timeout_s`` or the time left before
        ``deadline``, whichever is nearer. Cancelled, the page's generation stops after its current
        step (the thread is then free for the next page).

        Raises:
            PageError: the processor or the model failed on this page (out of memory: transient).
            DeadlinePassed: ``deadline`` passed while the page waited for the engine thread.
        """
        cancel = threading.Event()
        loop = asyncio.get_running_loop()
        try:
            gen, encode_s = await loop.run_in_executor(self._thread, self._run_page, page, deadline, cancel)
        except asyncio.CancelledError:
            cancel.set()
            raise
        timings = {
            "encode_s": round(encode_s, 4),
            "processor_s": round(gen.processor_s, 4),
            "prefill_s": round(gen.prefill_s, 4),
            "decode_s": round(gen.decode_s, 4),
        }
        if gen.retried:
            timings["first_try_s"] = round(gen.first_try_s, 4)
        return reply_result(self.spec, self.recipe.task, gen.reply, page, timings, gen.report())

    # -- on the engine thread ---------------------------------------------------------------

    def _load(self) -> None:
        hf_logging.disable_progress_bar()  # its "Loading weights" bars would garble logs and the CLI's status
        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        try:
            self._processor = AutoProcessor.from_pretrained(self.weights, local_files_only=True)
            net = AutoModelForImageTextToText.from_pretrained(
                self.weights,
                local_files_only=True,
                dtype=self.dtype,
                attn_implementation=self.cfg.attn_implementation,
            )
        except Exception as exc:  # a missing or corrupt file (config.json is there): the checkpoint's fault
            raise ValueError(f"engine.model={self.source!r}: cannot load it: {type(exc).__name__}: {exc}") from None
        self._net = net.to(self.device).eval()
        self.parameters = sum(p.numel() for p in self._net.parameters())
        log.info(
            "transformers engine: %s (%s, %d parameters) on %s in %s",
            self.model,
            type(self._net).__name__,
            self.parameters,
            self.device,
            self.dtype,
        )
        if self.unmapped:
            log.warning("transformers engine: sampling %s has no generate() counterpart; not applied", self.unmapped)

    def _warm_up(self) -> None:
        """One white page at the model's smallest size, :data:`WARM_UP_TOKENS` tokens."""
        side = self.spec.factor * max(1, round(math.sqrt(self.spec.min_pixels or 512 * 512) / self.spec.factor))
        image = np.full((side, side, 3), 255, dtype=np.uint8)
        uri = image_data_uri(image)
        messages = page_recipe(self.spec, self.recipe.task, uri)["messages"]
        warm = {**self.sampling, "max_new_tokens": WARM_UP_TOKENS}
        self._generate(messages, warm, time.monotonic() + self.cfg.page_timeout_s, threading.Event(), time.time())

    def _run_page(self, page: Page, deadline: Deadline | None, cancel: threading.Event) -> tuple[Generation, float]:
        """The page's generation and the seconds spent encoding its image.

        A reply cut by ``max_new_tokens`` is generated once more with the registry's
        ``retry_sampling`` (as the ``vllm`` engine does), within the same wall-clock cap
        (:meth:`Generation.after` tells what the page then reports)."""
        if deadline is not None and deadline.passed():
            raise DeadlinePassed(f"page {page.index + 1}: its deadline passed while it waited for the engine")
        started_at, t0 = time.time(), time.perf_counter()
        messages = self.request(page)["messages"]
        encode_s = time.perf_counter() - t0
        stop_at = time.monotonic() + (
            min(self.cfg.page_timeout_s, deadline.left()) if deadline else self.cfg.page_timeout_s
        )
        try:
            gen = self._generate(messages, self.sampling, stop_at, cancel, started_at)
            retry = retry_sampling(self.spec, self.spec.sampling) if gen.finish_reason == "length" else None
            if retry is not None:
                log.info(
                    "page %d: cut by max_new_tokens; retrying once with %s", page.index + 1, self.spec.retry_sampling
                )
                kwargs = generate_kwargs(retry, self.sampling["max_new_tokens"])
                gen = self._generate(messages, kwargs, stop_at, cancel, started_at).after(gen)
            return gen, encode_s
        except torch.OutOfMemoryError as exc:
            raise PageError(f"page {page.index + 1}: out of memory on {self.device}: {exc}", transient=True) from None
        except (RuntimeError, ValueError) as exc:
            raise PageError(f"page {page.index + 1}: {type(exc).__name__}: {exc}") from None

    def _generate(
        self,
        messages: list[dict],
        kwargs: dict,
        stop_at: float,
        cancel: threading.Event,
        started_at: float,
    ) -> Generation:
        """Process ``messages`` and generate with ``kwargs`` under the guards, stopping at the
        ``time.monotonic()`` instant ``stop_at``; ``started_at`` (Unix s) is when the page's work began."""
        t0 = time.perf_counter()
        inputs = self._processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        ).to(self.device)
        inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
        ids = inputs["input_ids"][0]
        prompt_len = int(ids.numel())
        cap = WallClockCap(stop_at, cancel)
        repeats = RepetitionGuard(self.repeat_guard, self._processor.tokenizer, prompt_len)
        clock = StepClock()
        t1 = time.perf_counter()
        with torch.inference_mode():
            out = self._net.generate(
                **inputs, **kwargs, streamer=clock, stopping_criteria=StoppingCriteriaList([cap, repeats])
            )
        new = out[0, prompt_len:]
        first = clock.puts[1] if len(clock.puts) > 1 else clock.ended
        decode_s, steps = clock.ended - first, new.numel() - 1
        return Generation(
            reply=self._processor.decode(new, skip_special_tokens=bool(self.spec.sampling.get("skip_special_tokens"))),
            finish_reason=self._finish_reason(new, kwargs["max_new_tokens"], cap, repeats),
            prompt_tokens=prompt_len,
            image_tokens=int((ids == self._net.config.image_token_id).sum()),
            new_tokens=int(new.numel()),
            processor_s=t1 - t0,
            prefill_s=first - t1,
            decode_s=decode_s,
            tokens_per_s=steps / decode_s if steps > 0 and decode_s > 0 else 0.0,
            started_at=started_at,
            ended_at=time.time(),
        )

    def _finish_reason(
        self, new: torch.Tensor, max_new_tokens: int, cap: WallClockCap, repeats: RepetitionGuard
    ) -> str:
        if repeats.fired:
            return "repetition"
        if cap.fired:
            return "time"
        eos = self._net.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        if new.numel() and int(new[-1]) in eos_ids:
            return "stop"
        return "length" if new.numel() >= max_new_tokens else "stop"
