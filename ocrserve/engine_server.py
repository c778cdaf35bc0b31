"""``ocrserve engine serve``: an ocrserve engine behind vLLM's OpenAI chat-completions protocol.

It answers the part of ``vllm serve``'s API a gateway uses, in vLLM's shapes:

* ``POST /v1/chat/completions``: the one image of the last user message (a base64 ``data:`` URI)
  is decoded and normalized by :mod:`ocrserve.preprocess`, read by the engine, and its text (lines
  joined by newlines) comes back as the assistant message. Prompt and sampling fields are accepted
  and ignored: the embedded engine does plain OCR. With ``"stream": true`` the same answer comes
  as vLLM's server-sent events (``chat.completion.chunk``: the role, the text, ``finish_reason``,
  then ``data: [DONE]``), sent once the page is read. Errors are OpenAI error bodies
  (``{"error": {"message", "type", "param", "code"}}``): 400 for a bad request or image, 404 for
  another model name, 500/503 when the engine fails.
* ``GET /v1/models``, ``GET /health`` (200 once the engine is loaded: the port opens only then, as
  with vLLM), ``GET /metrics`` with vLLM's gauges ``vllm:num_requests_waiting``,
  ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc`` (here: busy slots / slots) and the
  counter ``vllm:request_success_total`` by ``finished_reason`` (``stop``, or ``abort`` for a
  request whose client went away before its answer: like vLLM, the server then stops working on
  it and frees its slot).

Every completion names the server that produced it, in ``system_fingerprint`` and the
``X-Ocrserve-Replica`` header. At most ``engine.slots`` pages are in the engine at once; the rest
wait in arrival order and count as waiting. So CPU workers can run on other machines behind a
gateway (``engine.kind: vllm``, ``engine.vllm.base_urls``), and the vLLM client runs end to end on
machines without a GPU.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import socket
import time
import uuid

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from pydantic import BaseModel, ConfigDict

from ocrserve.api.disconnect import until_disconnect
from ocrserve.config import Config
from ocrserve.engines import create_engine
from ocrserve.engines.base import PageError
from ocrserve.errors import ClientGone, ProblemError
from ocrserve.pages import Page
from ocrserve.preprocess import DecodeFailure, Preprocessor

REPLICA_HEADER = "X-Ocrserve-Replica"
#: Seconds in-flight completions get to finish after SIGTERM.
GRACEFUL_SHUTDOWN_S = 30


class ApiError(Exception):
    """An OpenAI-style error response.

    Attributes:
        status: HTTP status.
        message: what went wrong.
        kind: OpenAI error ``type`` (``BadRequestError``, ``NotFoundError``, ...).
        param: the request field at fault, if one is.
    """

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> JSONResponse:
        """The error as vLLM sends it (``ErrorResponse`` in ``vllm/entrypoints/serve/engine/protocol.py``)."""
        return JSONResponse(
            {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}},
            status_code=self.status,
        )


class ChatRequest(BaseModel):
    """The fields of a chat-completions request this server reads; the rest are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict]
    stream: bool = False
    priority: int = 0


def image_bytes(messages: list[dict]) -> bytes:
    """The bytes of the single ``image_url`` part of the last user message.

    Raises:
        ApiError: 400 when there is no user message, not exactly one image, or the image is not a
            base64 ``data:`` URI.
    """
    users = [m for m in messages if m.get("role") == "user"]
    content = users[-1].get("content") if users else None
    parts = (
        [p for p in content if isinstance(p, dict) and p.get("type") == "image_url"]
        if isinstance(content, list)
        else []
    )
    if len(parts) != 1:
        raise ApiError(
            400, f"the last user message must hold exactly one image_url part, found {len(parts)}", param="messages"
        )
    url = str((parts[0].get("image_url") or {}).get("url", ""))
    header, _, payload = url.partition(",")
    if not (header.startswith("data:") and header.endswith(";base64")):
        raise ApiError(400, "image_url must be a base64 data: URI (data:image/png;base64,...)", param="messages")
    try:
        return base64.b64decode(payload, validate=True)
    except binascii.Error as exc:
        raise ApiError(400, f"image_url: bad base64: {exc}", param="messages") from None


class EngineServer:
    """An engine, its preprocessor, its slots and vLLM-named metrics.

    Args:
        config: the profile (``engine`` and ``preprocess`` are used).
        served_model_name: the model id clients must name (vLLM's ``--served-model-name``).
        replica_id: how completions name this server.
    """

    def __init__(self, config: Config, served_model_name: str, replica_id: str):
        self.config = config
        self.served_model_name = served_model_name
        self.fingerprint = f"ocrserve-{config.engine.kind}@{replica_id}"
        self.engine = create_engine(config)
        self.preprocessor = Preprocessor(config.preprocess)
        self.waiting = 0
        self.running = 0
        self._slots = asyncio.Semaphore(self.engine.slots)
        self.registry = CollectorRegistry()
        self._finished = self._metrics()

    def _metrics(self) -> Counter:
        labels = {"model_name": self.served_model_name, "engine": "0"}  # vLLM's label names
        for name, doc, read in (
            ("vllm:num_requests_waiting", "Requests waiting for an engine slot.", lambda: self.waiting),
            ("vllm:num_requests_running", "Requests in the engine.", lambda: self.running),
            (
                "vllm:kv_cache_usage_perc",
                "Busy engine slots / slots (1 = full).",
                lambda: self.running / self.engine.slots,
            ),
        ):
            Gauge(name, doc, list(labels), registry=self.registry).labels(**labels).set_function(read)
        finished = Counter(
            "vllm:request_success",
            "Requests finished, by finished_reason (stop, abort).",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        for reason in ("stop", "abort"):
            finished.labels(**labels, finished_reason=reason)
        return finished

    async def start(self) -> None:
        """Load and warm the engine and the decoding processes."""
        await asyncio.gather(self.engine.start(), self.preprocessor.warm_up())

    async def close(self) -> None:
        """Stop the engine and the decoding processes."""
        await self.engine.close()
        self.preprocessor.close()

    async def decode(self, data: bytes) -> Page:
        """One normalized page from image bytes.

        Raises:
            ApiError: 400 for an undecodable or oversized image, or one with several pages.
        """
        try:
            info = await self.preprocessor.inspect(data)
            if info.page_count != 1:
                raise ApiError(400, f"the image has {info.page_count} pages; send one page per request")
            (page,) = [p async for chunk in self.preprocessor.pages(data, info, [0]) for p in chunk]
        except ProblemError as problem:
            raise ApiError(400, problem.detail, param="messages") from None
        if isinstance(page, DecodeFailure):
            raise ApiError(400, page.problem.detail, param="messages")
        return page

    async def complete(self, request: ChatRequest) -> dict:
        """Answer one chat-completions request (see the module docstring).

        Raises:
            ApiError: 404 for another model, 400 for a bad image, 500/503 when the
                engine fails (503 when retrying may help).
        """
        if request.model != self.served_model_name:
            raise ApiError(404, f"The model `{request.model}` does not exist.", "NotFoundError", "model")
        page = await self.decode(image_bytes(request.messages))
        try:
            text = await self._read(page, request.priority)
        except asyncio.CancelledError:
            self._count("abort")
            raise
        self._count("stop")
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.served_model_name,
            "system_fingerprint": self.fingerprint,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
        }

    def _count(self, reason: str) -> None:
        self._finished.labels(model_name=self.served_model_name, engine="0", finished_reason=reason).inc()

    async def _read(self, page: Page, priority: int) -> str:
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            result = await self.engine.ocr_page(page, priority=priority)
        except PageError as exc:
            raise ApiError(503 if exc.transient else 500, str(exc), "InternalServerError") from None
        finally:
            self.running -= 1
            self._slots.release()
        return result.text


def _chunks(completion: dict):
    """A finished completion as vLLM streams one: ``data:`` events of ``chat.completion.chunk``
    (the role, the content, the finish reason), then ``data: [DONE]``."""
    (choice,) = completion["choices"]
    head = {key: completion[key] for key in ("id", "created", "model", "system_fingerprint")}
    deltas = [
        ({"role": "assistant", "content": ""}, None),
        ({"content": choice["message"]["content"]}, None),
        ({}, choice["finish_reason"]),
    ]
    for delta, finish in deltas:
        chunk = head | {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


def create_engine_app(config: Config, *, served_model_name: str, replica_id: str) -> FastAPI:
    """The FastAPI app of ``ocrserve engine serve`` (see the module docstring)."""
    server = EngineServer(config, served_model_name, replica_id)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await server.start()
        try:
            yield
        finally:
            await server.close()

    app = FastAPI(title="ocrserve engine", summary="An OCR engine behind OpenAI chat completions.", lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=exc.status)  # nobody reads it; logged as the client's disconnect

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return ApiError(400, f"{where}: {first.get('msg', 'invalid request')}", param=where or None).response()

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        """One page in (an image_url data URI), its text out as the assistant message (streamed
        when asked); a client that disconnects first aborts it."""
        completion = await until_disconnect(request, server.complete(body))
        headers = {REPLICA_HEADER: server.fingerprint}
        if body.stream:
            return StreamingResponse(_chunks(completion), media_type="text/event-stream", headers=headers)
        return JSONResponse(completion, headers=headers)

    @app.get("/v1/models")
    async def models() -> dict:
        """The served model, vLLM-style, plus this server's slots."""
        return {
            "object": "list",
            "data": [
                {
                    "id": served_model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "ocrserve",
                    "root": config.engine.model,
                    "slots": server.engine.slots,
                }
            ],
        }

    @app.get("/health")
    async def health() -> Response:
        """200 while the engine serves (the port opens only once it is loaded)."""
        return Response(status_code=200 if server.engine.ready else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        """vLLM's scheduler gauges for this server, Prometheus text format."""
        return Response(generate_latest(server.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def serve(config: Config, *, host: str, port: int, served_model_name: str | None = None) -> None:
    """Run the engine server until SIGINT/SIGTERM; in-flight completions drain first."""
    app = create_engine_app(
        config, served_model_name=served_model_name or config.engine.model, replica_id=f"{socket.gethostname()}:{port}"
    )
    uvicorn.run(
        app, host=host, port=port, log_level=config.server.log_level, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S
    )
