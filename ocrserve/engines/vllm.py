"""The GPU engine: pages to vLLM's OpenAI-compatible chat completions over HTTP, across replicas.

Each page travels as a base64 ``data:`` URI with the model's task prompt and sampling
(:mod:`ocrserve.engines.chat`); the reply is cleaned up and split into lines the same way. Pages go
to the replica with the fewest requests outstanding from this gateway (ties rotate), among those
that are up.

Replies stream (``"stream": true``, server-sent events read with httpx-sse) under two guards
(:mod:`ocrserve.engines.chat`, shared with the ``transformers`` engine):

* **repetition**: HunyuanOCR's batch-client rule (:class:`~ocrserve.engines.chat.RepeatWatch`,
  ``engine.repeat_guard``: from 4,000 characters on, every 1,000, the last 8,000 searched for a tail
  unit repeated 8 times) runs on the text as it arrives; when it fires the engine stops reading
  and closes the response at once. Closing the connection is how a client cancels in vLLM: the API
  server notices the disconnect and aborts the request in the engine (``AsyncLLM.generate`` aborts
  on ``CancelledError``, vLLM's ``entrypoints/utils.py`` ``with_cancellation`` /
  ``listen_for_disconnect``), which frees its KV cache.
* **length**: a reply ``max_tokens`` cut (``finish_reason: "length"``) is retried once with the
  model card's stronger repetition guard (``ModelSpec.retry_sampling``: HunyuanOCR a higher
  ``repetition_penalty``, olmOCR its next temperature); still cut, the page is ``truncated``.

The page's ``generation`` says which fired: ``finish_reason`` (``stop``, ``length``,
``repetition``; the debug engine's vocabulary), ``truncated`` and ``retried``.

Failures: a connection error (refused, reset, lost mid-request) or a 503 is retried, with a short
exponential wait, on the next replica, up to ``engine.vllm.max_retries`` times, and then becomes a
transient :class:`~ocrserve.engines.base.PageError`; so does a page that gets no reply within
``timeout_s`` (not retried: it would load the replicas twice). Any other status is the page's own
failure, never retried: 4xx is permanent (vLLM refuses what it will always refuse; the page's 422),
5xx transient.

A background task polls every replica each ``poll_interval_s``: ``/health`` (200 = engine alive),
``/v1/models`` when a replica comes up (it must serve ``engine.model``), and ``/metrics`` for
``vllm:num_requests_waiting``, ``vllm:num_requests_running`` and ``vllm:kv_cache_usage_perc``
(vLLM's names, ``vllm/v1/metrics/loggers.py``), which become ocrserve's ``ocrserve_vllm_*`` gauges
and :attr:`VllmEngine.requests_waiting` / :attr:`VllmEngine.kv_cache_usage` for admission. The
engine is ``ready`` while at least one replica is up.

Each replica's state carries the wall-clock time it last changed (``since``) and, while down, why
(``connection refused``, ``/health answered 503``, ...): ``GET /v1/models`` lists them, the 503 of a
synchronous request while none is up names them (:meth:`VllmEngine.unready`), and
``ocrserve_vllm_replica_up_changed_timestamp_seconds`` exports the time. A replica that has never
been up makes the engine "still loading"; one that was up and went down makes it "down".
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import httpx
from httpx_sse import SSEError, aconnect_sse
from prometheus_client.parser import text_string_to_metric_families
from tenacity import retry_if_exception_type

from ocrserve import backoff, metrics
from ocrserve.config import Config
from ocrserve.engines.base import Engine, PageError, Unready
from ocrserve.engines.chat import RepeatWatch, completion_request, image_data_uri, reply_result, retry_sampling
from ocrserve.errors import DeadlinePassed
from ocrserve.models import ModelError, get_model
from ocrserve.pages import Page, PageResult
from ocrserve.work import Deadline

log = logging.getLogger(__name__)

#: Seconds a /health, /v1/models or /metrics probe may take before the replica counts as down.
PROBE_TIMEOUT_S = 3.0
#: Seconds an attempt may outlive the page's deadline, so that a deadline passing while the page is
#: in vLLM ends in one place: the router's wait for the page, which answers 504 and cancels the
#: attempt (its connection closes and vLLM aborts the request). With two timers due at the same
#: instant, a real-vLLM test once saw the attempt's own end answered as a transient 503 ("no reply
#: within 10 s") instead.
DEADLINE_GRACE_S = 1.0
#: First wait between attempts, seconds; doubles per attempt up to RETRY_WAIT_MAX_S.
RETRY_WAIT_S = 0.2
RETRY_WAIT_MAX_S = 2.0
#: vLLM's gauges -> :class:`Replica` attributes. ``vllm:gpu_cache_usage_perc`` is the name before
#: vLLM 0.10 renamed it (``vllm/v1/metrics/loggers.py``).
WATCHED_METRICS = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",
}

#: KV-cache usage (0-1) above which vLLM would start preempting; the router holds pages back.
KV_CACHE_FULL = 0.95
#: vLLM's histogram of the seconds a request spent running (prefill + decode, after its queue
#: wait; ``vllm/v1/metrics/loggers.py``): its ``_sum`` / ``_count`` between two polls is how long
#: the requests that just finished ran, whoever sent them.
INFERENCE_TIME = "vllm:request_inference_time_seconds"


def server_root(url: str) -> str:
    """``http://host:port`` from a base URL given with or without a trailing ``/`` or ``/v1``."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def read_vllm_metrics(exposition: str) -> dict[str, float]:
    """The watched gauges from a Prometheus text exposition (see :data:`WATCHED_METRICS`).

    A data-parallel vLLM reports one sample per engine: counts are summed, KV-cache usage (0-1)
    is the fullest engine's. :data:`INFERENCE_TIME`'s ``_sum`` (seconds) and ``_count``
    (requests) become ``inference_s_sum`` and ``inference_count``.
    """
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name == INFERENCE_TIME:
            for suffix, key in (("_sum", "inference_s_sum"), ("_count", "inference_count")):
                values[key] = sum(s.value for s in family.samples if s.name == INFERENCE_TIME + suffix)
            continue
        key = WATCHED_METRICS.get(family.name)
        samples = [s.value for s in family.samples]
        if key and samples:
            values[key] = max(samples) if key == "kv_cache_usage" else sum(samples)
    return values


@dataclass(eq=False)
class Replica:
    """One vLLM server as this gateway sees it.

    Attributes:
        url: server root, ``http://host:port``.
        up: answers ``/health`` and serves the model (as of the last poll or request).
        since: Unix time (s, wall clock) ``up`` last changed, or of the first poll when it has
            never been up; None before the first poll.
        reason: why it is down (``connection refused``, ``/health answered 503``); "" while up.
        was_up: it has been up since this gateway started.
        models: model ids its ``/v1/models`` listed last.
        outstanding: requests this gateway has in flight there.
        waiting, running: vLLM's queued / running requests at the last poll (all clients).
        kv_cache_usage: fraction of its KV cache in use at the last poll, 0-1.
        request_s: seconds the requests that finished between its last two polls that saw any
            finish ran, on average (vLLM's :data:`INFERENCE_TIME`); None before any finished.
        inference_seen: :data:`INFERENCE_TIME`'s (``_sum``, ``_count``) at the last poll.
    """

    url: str
    up: bool = False
    since: float | None = None
    reason: str = ""
    was_up: bool = False
    models: list[str] = field(default_factory=list)
    outstanding: int = 0
    waiting: float = 0.0
    running: float = 0.0
    kv_cache_usage: float = 0.0
    request_s: float | None = None
    inference_seen: tuple[float, float] = (0.0, 0.0)

    def record_load(self, values: dict[str, float]) -> None:
        """Take a poll's :func:`read_vllm_metrics`: the load gauges, and ``request_s`` from the
        requests finished since the last poll (none finished, or vLLM restarted and its counters
        began anew: kept)."""
        self.waiting = values.get("waiting", 0.0)
        self.running = values.get("running", 0.0)
        self.kv_cache_usage = values.get("kv_cache_usage", 0.0)
        seen = (values.get("inference_s_sum", 0.0), values.get("inference_count", 0.0))
        finished = seen[1] - self.inference_seen[1]
        if finished > 0:
            self.request_s = (seen[0] - self.inference_seen[0]) / finished
        self.inference_seen = seen

    def foreign(self) -> float:
        """Requests in vLLM, waiting or running, that are not this gateway's: vLLM's requests less
        this gateway's ``outstanding`` ones (last poll)."""
        return max(0.0, self.running + self.waiting - self.outstanding)

    def foreign_waiting(self) -> float:
        """The :meth:`foreign` requests waiting in vLLM's queue: at most its ``waiting`` (last poll)."""
        return min(self.waiting, self.foreign())

    def drain_s(self) -> float | None:
        """Seconds until vLLM has started every :meth:`foreign_waiting` request: that many, each
        running ``request_s``, ``running`` at once (vLLM's batch as it ran at the last poll).
        None before any request finished."""
        if self.request_s is None:
            return None
        return self.foreign_waiting() * self.request_s / max(1.0, self.running)


@dataclass
class Reply:
    """One streamed completion as read: its text and why it ended (``stop``, ``length``, or
    ``repetition`` when the guard stopped reading)."""

    text: str
    finish_reason: str
    completion_tokens: int | None = None


class _Unavailable(Exception):
    """The replica could not take the request (connection error or 503): try another."""


class VllmEngine(Engine):
    """OCR through vLLM's chat-completions API (see module docstring).

    Args:
        config: the profile; ``engine.model`` picks the recipe (``ocrserve.models``),
            ``engine.vllm`` the replicas and client settings, ``vllm.scheduling_policy`` whether
            ``priority`` is sent.

    Raises:
        ValueError: no replicas configured, slots unknown, or a model the registry cannot serve.
    """

    def __init__(self, config: Config):
        super().__init__()
        self.cfg = config.engine.vllm
        if not self.cfg.base_urls:
            raise ValueError(
                "engine.vllm.base_urls is empty: `ocrserve launch` fills it when it starts vLLM; "
                "list your vLLM servers there to use running ones"
            )
        try:
            self.spec = get_model(config.engine.model)
        except ModelError as exc:
            raise ValueError(f"engine.model: {exc}") from None
        self.model = self.spec.id
        self.replicas = [Replica(server_root(url)) for url in self.cfg.base_urls]
        self.slots_per_replica = _slots_per_replica(config)
        self.send_priority = config.vllm.scheduling_policy != "fcfs"
        self.repeat_guard = config.engine.repeat_guard
        self._client: httpx.AsyncClient | None = None
        self._poller: asyncio.Task | None = None
        self._turn = 0

    @property
    def slots(self) -> int:
        return self.slots_per_replica * len(self.replicas)

    @property
    def requests_waiting(self) -> float:
        """Requests queued inside the replicas that are up (vLLM's own queue, all clients), last poll."""
        return sum(r.waiting for r in self.replicas if r.up)

    @property
    def kv_cache_usage(self) -> float:
        """KV-cache usage of the fullest replica that is up, 0-1, last poll (0 when none is up)."""
        return max((r.kv_cache_usage for r in self.replicas if r.up), default=0.0)

    def saturated(self) -> bool:
        """True while vLLM queues requests itself or its KV cache is nearly full (last poll): new
        pages then wait in ocrserve's router, where lanes order them, not in vLLM's FCFS queue."""
        return self.requests_waiting > 0 or self.kv_cache_usage >= KV_CACHE_FULL

    def queued_inside(self) -> tuple[float, float | None]:
        """Other clients' requests queued in the replicas that are up (last poll), plus one for each
        whose KV cache is nearly full (a running request must end before another starts), and the
        seconds until vLLM has started them all: the slowest replica's :meth:`Replica.drain_s`,
        which the router waits for (:meth:`saturated`); None before vLLM finished a request."""
        live = [r for r in self.replicas if r.up]
        full = [r for r in live if r.kv_cache_usage >= KV_CACHE_FULL]
        queued = sum(r.foreign_waiting() for r in live) + len(full)
        drains = [r.drain_s() for r in live]
        if not queued or None in drains:
            return queued, None
        drains += [r.request_s / max(1.0, r.running) for r in full]
        return queued, max(drains)

    def others_inside(self) -> float:
        """Other clients' requests in the replicas that are up, waiting or running
        (:meth:`Replica.foreign`, last poll)."""
        return sum(r.foreign() for r in self.replicas if r.up)

    async def start(self) -> None:
        """Poll every replica once, then keep polling in the background.

        Not being able to reach a replica is not an error (``ready`` stays false until one
        answers); a replica that answers but serves another model is.

        Raises:
            ValueError: a replica lists models and ``engine.model`` is not among them.
        """
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(self.cfg.timeout_s, connect=self.cfg.connect_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=self.slots),
        )
        await self._poll_all()
        for replica in self.replicas:
            if replica.models and self.model not in replica.models:
                raise ValueError(
                    f"{replica.url} serves {', '.join(replica.models)}, not {self.model}; "
                    "set engine.model to the model it serves"
                )
        self._poller = asyncio.create_task(self._poll_forever(), name="ocrserve-vllm-poll")

    async def close(self) -> None:
        self.ready = False
        if self._poller:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self._client:
            await self._client.aclose()

    def unready(self) -> Unready | None:
        """None while a replica is up; else which are down, since when and why. ``loading`` while no
        replica has been up yet. ``retry_after_s``: ``poll_interval_s`` rounded up, within which a
        replica that is back is found."""
        if self.ready:
            return None
        retry_after = max(1, math.ceil(self.cfg.poll_interval_s))
        if not any(r.was_up for r in self.replicas):
            states = "; ".join(
                f"{r.url} not up yet ({r.reason}; polled since {_utc(r.since)})"
                if r.since
                else f"{r.url} not polled yet"
                for r in self.replicas
            )
            return Unready(True, f"no vLLM replica has come up yet: {states}", retry_after)
        states = "; ".join(
            f"{r.url} down since {_utc(r.since)} ({r.reason})"
            if r.was_up
            else f"{r.url} never up ({r.reason}; polled since {_utc(r.since)})"
            for r in self.replicas
        )
        return Unready(False, f"no vLLM replica is up: {states}", retry_after)

    def describe(self) -> dict:
        """``GET /v1/models`` entry: the base fields plus each replica's state: ``up``, ``since``
        (ISO 8601 UTC time it last changed; of the first poll while never up), ``reason`` (why
        it is down; null while up), and its load."""
        return super().describe() | {
            "replicas": [
                {
                    "url": r.url,
                    "up": r.up,
                    "since": _utc(r.since) if r.since is not None else None,
                    "reason": r.reason or None,
                    "outstanding": r.outstanding,
                    "waiting": r.waiting,
                    "kv_cache_usage": r.kv_cache_usage,
                }
                for r in self.replicas
            ],
        }

    async def ocr_page(self, page: Page, *, priority: int = 0, deadline: Deadline | None = None) -> PageResult:
        """Send the page to a replica and read its reply. See :class:`Engine` and the module docstring.

        The request's timeout is ``engine.vllm.timeout_s`` or the time left before ``deadline``,
        whichever is shorter. Cancelled (deadline, client gone), the request's connection closes,
        which makes vLLM abort it and free its KV cache. A reply cut by ``max_tokens`` is sent once
        more with :func:`~ocrserve.engines.chat.retry_sampling` (each attempt under the same
        deadline).
        """
        started = time.perf_counter()
        body = await asyncio.to_thread(self._request_body, page, priority)
        sent = time.perf_counter()
        try:
            reply = await self._complete(body, deadline)
            retry = retry_sampling(self.spec, body) if reply.finish_reason == "length" else None
            if retry is not None:
                log.info("page %d: cut by max_tokens; retrying once with %s", page.index + 1, self.spec.retry_sampling)
                reply = await self._complete(retry, deadline)
        except PageError:
            if deadline is not None and deadline.passed():
                raise DeadlinePassed(f"page {page.index + 1}: its deadline passed in the engine") from None
            raise
        return self._result(page, reply, started, sent, retried=retry is not None)

    async def calibration_page(self, page: Page, *, priority: int = 0, max_tokens: int) -> PageResult:
        """One request for the page with ``max_tokens`` at most the model card's and
        ``max_tokens``, never retried: the random-weight test model never ends its reply, and
        HunyuanOCR's card allows 16,384 tokens, so a calibration page ran for minutes on vLLM's
        CPU backend (twice, with the length retry) before ``/readyz`` could turn 200."""
        started = time.perf_counter()
        body = await asyncio.to_thread(self._request_body, page, priority)
        body["max_tokens"] = min(int(body.get("max_tokens") or max_tokens), max_tokens)
        sent = time.perf_counter()
        reply = await self._complete(body, None)
        return self._result(page, reply, started, sent, retried=False)

    def _result(self, page: Page, reply: Reply, started: float, sent: float, *, retried: bool) -> PageResult:
        """``page``'s result from ``reply``: ``encode_s`` from ``started`` to ``sent`` and ``vllm_s``
        from ``sent`` to now (``time.perf_counter`` seconds), and how the reply ended."""
        timings = {"encode_s": round(sent - started, 4), "vllm_s": round(time.perf_counter() - sent, 4)}
        generation = {"finish_reason": reply.finish_reason, "truncated": reply.finish_reason == "length"}
        generation["retried"] = retried
        if reply.completion_tokens is not None:
            generation["completion_tokens"] = reply.completion_tokens
        return reply_result(self.spec, self.cfg.task, reply.text, page, timings, generation)

    def _request_body(self, page: Page, priority: int) -> dict:
        uri = image_data_uri(page.image, self.cfg.image_format, self.cfg.jpeg_quality)
        return completion_request(
            self.spec, self.cfg.task, uri, model=self.model, priority=priority if self.send_priority else None
        )

    async def _complete(self, body: dict, deadline: Deadline | None) -> Reply:
        """The reply to ``body`` from some replica; each attempt's timeout is :meth:`_timeout`."""
        attempts = backoff.retrying(
            self.cfg.max_retries + 1, RETRY_WAIT_S, RETRY_WAIT_MAX_S, retry_if_exception_type(_Unavailable)
        )
        try:
            async for attempt in attempts:
                with attempt:
                    return await self._send(body, self._timeout(deadline))
        except _Unavailable as exc:
            raise PageError(
                f"no vLLM replica took the page ({self.cfg.max_retries + 1} attempts); last: {exc}", transient=True
            ) from None

    def _timeout(self, deadline: Deadline | None) -> float:
        """Seconds one attempt may wait for its reply: ``timeout_s``, or less when the deadline is
        nearer (:data:`DEADLINE_GRACE_S` past it)."""
        return min(self.cfg.timeout_s, deadline.left() + DEADLINE_GRACE_S) if deadline else self.cfg.timeout_s

    def _pick(self) -> Replica:
        """The up replica with the fewest outstanding requests; ties rotate. All replicas when none is up."""
        live = [r for r in self.replicas if r.up] or self.replicas
        self._turn += 1
        order = {id(r): (i - self._turn) % len(live) for i, r in enumerate(live)}
        return min(live, key=lambda r: (r.outstanding, order[id(r)]))

    async def _send(self, body: dict, timeout: float) -> Reply:
        """One attempt on one replica: the streamed reply, read within ``timeout`` seconds in all."""
        replica = self._pick()
        replica.outstanding += 1
        try:
            async with asyncio.timeout(timeout):
                async with aconnect_sse(
                    self._client,
                    "POST",
                    replica.url + "/v1/chat/completions",
                    json=body | {"stream": True, "stream_options": {"include_usage": True}},
                    timeout=httpx.Timeout(timeout, connect=self.cfg.connect_timeout_s),
                ) as source:
                    response = source.response
                    if response.status_code != 200:
                        await response.aread()
                        self._refused(replica, response)
                    reply = await self._read_stream(source, replica.url)
                    # leaving the block closes the response; after a guard fired that is the
                    # disconnect that makes vLLM abort the request
        except (TimeoutError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout):
            metrics.VLLM_REQUESTS.labels(replica.url, "timeout").inc()
            raise PageError(f"{replica.url}: no reply within {timeout:.3g} s", transient=True) from None
        except httpx.TransportError as exc:
            self._set_up(replica, False, _why(exc))
            metrics.VLLM_REQUESTS.labels(replica.url, "unavailable").inc()
            raise _Unavailable(f"{replica.url}: {type(exc).__name__}: {exc}") from None
        finally:
            replica.outstanding -= 1
        metrics.VLLM_REQUESTS.labels(replica.url, "ok").inc()
        return reply

    def _refused(self, replica: Replica, response: httpx.Response) -> None:
        """Raise for a non-200 answer: 503 -> :class:`_Unavailable`, else the page's own error."""
        if response.status_code == 503:
            # vLLM's queue is full (--max-num-queued-reqs) or it is not serving: hold the router's
            # pages back until the next poll says otherwise (saturated())
            replica.waiting = max(replica.waiting, 1.0)
            metrics.VLLM_REQUESTS.labels(replica.url, "unavailable").inc()
            raise _Unavailable(f"{replica.url}: 503 {_error_message(response)}")
        metrics.VLLM_REQUESTS.labels(replica.url, "error").inc()
        raise PageError(
            f"{replica.url} answered {response.status_code}: {_error_message(response)}",
            transient=response.status_code >= 500,
            status=response.status_code,
        )

    async def _read_stream(self, source, url: str) -> Reply:
        """Chunks of ``chat.completion.chunk`` up to ``[DONE]`` (vLLM's streaming format), joined,
        under the repetition guard: it firing ends the read with ``repetition``.

        Raises:
            PageError: the stream is not a chat completion's, carries an error, or ends before
                its ``finish_reason`` (transient).
        """
        watch = RepeatWatch(self.repeat_guard)
        parts: list[str] = []
        size = 0
        finish = None
        used = None
        try:
            async for event in source.aiter_sse():
                if event.data.strip() == "[DONE]":
                    break
                chunk = json.loads(event.data)
                if "error" in chunk:
                    raise PageError(f"{url} failed the page mid-stream: {chunk['error']}", transient=True)
                usage = chunk.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    used = usage["completion_tokens"]  # the last chunk's, with stream_options.include_usage
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content") or ""
                    if piece:
                        parts.append(piece)
                        size += len(piece)
                    finish = choice.get("finish_reason") or finish
                if size >= watch.next_check and watch.check("".join(parts)):
                    log.info("%s: reply repeats its tail at %d characters; stopped reading", url, size)
                    return Reply("".join(parts), "repetition")
        except (SSEError, ValueError, AttributeError, TypeError) as exc:
            raise PageError(f"{url} answered 200 without a chat-completion stream: {exc}", transient=True) from None
        if finish is None:
            raise PageError(f"{url}: the reply's stream ended before its finish_reason", transient=True)
        return Reply("".join(parts), "length" if finish == "length" else "stop", used)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.poll_interval_s)
            await self._poll_all()

    async def _poll_all(self) -> None:
        await asyncio.gather(*(self._poll(r) for r in self.replicas))

    async def _poll(self, replica: Replica) -> None:
        reason = ""
        try:
            health = await self._client.get(replica.url + "/health", timeout=PROBE_TIMEOUT_S)
            if health.status_code != 200:
                reason = f"/health answered {health.status_code}"
            elif not replica.up:
                reason = await self._serves_model(replica)
            if not reason:
                exposition = await self._client.get(replica.url + "/metrics", timeout=PROBE_TIMEOUT_S)
                self._record_load(replica, read_vllm_metrics(exposition.text))
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: an unparsable exposition
            log.debug("poll of %s failed: %s", replica.url, exc)
            reason = _why(exc)
        self._set_up(replica, not reason, reason)

    async def _serves_model(self, replica: Replica) -> str:
        """ "" when the replica's ``/v1/models`` lists ``engine.model``, else why not."""
        listing = await self._client.get(replica.url + "/v1/models", timeout=PROBE_TIMEOUT_S)
        listing.raise_for_status()
        replica.models = [m.get("id", "") for m in listing.json().get("data", [])]
        if self.model not in replica.models:
            log.warning("%s serves %s, not %s; not sending it pages", replica.url, replica.models, self.model)
            return f"serves {', '.join(replica.models) or 'no model'}, not {self.model}"
        return ""

    def _record_load(self, replica: Replica, values: dict[str, float]) -> None:
        replica.record_load(values)
        metrics.VLLM_REQUESTS_WAITING.labels(replica.url).set(replica.waiting)
        metrics.VLLM_REQUESTS_RUNNING.labels(replica.url).set(replica.running)
        metrics.VLLM_KV_CACHE_USAGE.labels(replica.url).set(replica.kv_cache_usage)

    def _set_up(self, replica: Replica, up: bool, reason: str = "") -> None:
        """Record the replica's state; ``reason``: why it is down."""
        if up != replica.up or replica.since is None:
            replica.since = time.time()
            metrics.VLLM_REPLICA_UP_CHANGED.labels(replica.url).set(replica.since)
            if up != replica.up:
                log.warning("vLLM replica %s is %s", replica.url, "up" if up else f"down ({reason})")
        replica.up = up
        replica.was_up = replica.was_up or up
        replica.reason = "" if up else reason or "unknown"
        metrics.VLLM_REPLICA_UP.labels(replica.url).set(int(up))
        self.ready = any(r.up for r in self.replicas)


def _slots_per_replica(config: Config) -> int:
    """``engine.vllm.slots_per_replica``, or ``vllm.max_num_seqs`` when that is ``auto``.

    Raises:
        ValueError: both are ``auto`` (replicas ocrserve did not plan, so nothing knows their batch).
    """
    slots = config.engine.vllm.slots_per_replica
    if slots == "auto":
        slots = config.vllm.max_num_seqs
    if slots == "auto":
        raise ValueError(
            "engine.vllm.slots_per_replica is auto and so is vllm.max_num_seqs: for vLLM servers "
            "ocrserve did not launch, set either to their --max-num-seqs"
        )
    return slots


def _utc(stamp: float) -> str:
    """``2026-12-03T14:50:02Z`` for Unix time ``stamp`` (ISO 8601, UTC, whole seconds)."""
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _why(exc: Exception) -> str:
    """Why a request to a replica failed, in a few words: ``connection refused`` (the socket's
    errno), ``no answer in time (ReadTimeout)``, or the exception's type and message."""
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer in time ({type(exc).__name__})"
    cause: BaseException | None = exc
    while cause is not None:  # httpx wraps the OSError of the socket (anyio, httpcore)
        if isinstance(cause, OSError) and cause.errno:
            return os.strerror(cause.errno).lower()  # "connection refused"
        cause = cause.__cause__ or cause.__context__
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _error_message(response: httpx.Response) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the body's start."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
