#!/usr/bin/env python3
"""Stand-ins for vLLM in tests.

* Run as a script, the ``vllm`` executable for launcher tests: ``vllm serve MODEL --host H --port P
  ...`` becomes ``python -m ocrserve engine serve --backend onnx`` serving MODEL on H:P (every other
  flag is ignored). The Python running this script runs the engine, so it must have ocrserve
  installed.
* Imported, :class:`ScriptedVllm`: a real HTTP server (uvicorn, in a thread) speaking vLLM's
  chat-completions protocol, streaming or not, whose replies a test scripts: a normal one, one cut
  by ``max_tokens`` (``finish_reason: "length"``), or one that loops until the client hangs up. It
  records every request body and counts the streams aborted by a client disconnect, as vLLM
  aborts a streaming request whose client went away.

Why a stand-in where the real vLLM (``tests/real_vllm.py``, tier ``real_vllm``) shows the rest:

* the script: the launcher's plan, log relay and start-up on machines without vLLM's CPU build,
  in seconds rather than vLLM's 30-120 s, and a vLLM that dies before it is healthy with a line
  of our choosing (``FAKE_VLLM_FAIL``). Restarts after a kill and the SIGTERM drain run against
  the real vLLM (``tests/test_real_launch.py``).
* :class:`ScriptedVllm`: replies of a given text. The tiny random-weight model cannot be made to
  write a reply that repeats a unit from 4,000 characters on (the repetition guard) or one that
  ends with ``stop``; it only ever stops at its token cap. Its ``/metrics`` always reports 0
  waiting: vLLM's real load (waiting, running, KV usage, its 503) is tested on the real engine.

Environment (script):
    FAKE_VLLM_FAIL: print this line and exit 1 instead (a vLLM that dies at start-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Scripted:
    """One reply: ``text`` then ``finish_reason`` (``stop`` or ``length``); with ``loop``, ``text``
    comes once and then ``loop`` again and again until the client disconnects."""

    text: str
    finish_reason: str = "stop"
    loop: str = ""


@dataclass
class ScriptedVllm:
    """A scripted vLLM on 127.0.0.1 (see the module docstring); a context manager.

    Attributes:
        model: the served model name.
        replies: reply for request 1, 2, ...; the last one repeats.
        requests: the bodies received, in order.
        aborted: streams the client left before their end (vLLM's ``finished_reason="abort"``).
        finished: streams sent to their ``[DONE]``.
        chunk_chars: characters per streamed chunk; delay_s: pause between chunks.
    """

    model: str
    replies: list[Scripted] = field(default_factory=lambda: [Scripted("hello")])
    chunk_chars: int = 10
    delay_s: float = 0.001
    requests: list[dict] = field(default_factory=list)
    aborted: int = 0
    finished: int = 0
    chunks_sent: int = 0

    def __enter__(self) -> ScriptedVllm:
        import socket

        import uvicorn

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self._app(), port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "scripted vLLM did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    def _app(self):
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
        from starlette.routing import Route

        async def completions(request: Request):
            body = await request.json()
            self.requests.append(body)
            reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
            if not body.get("stream"):
                return JSONResponse(self._completion(reply))
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._stream(reply, usage), media_type="text/event-stream")

        async def health(request: Request):
            return PlainTextResponse("")

        async def models(request: Request):
            return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

        async def prometheus(request: Request):
            return PlainTextResponse("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0.0\n")

        return Starlette(
            routes=[
                Route("/v1/chat/completions", completions, methods=["POST"]),
                Route("/health", health),
                Route("/v1/models", models),
                Route("/metrics", prometheus),
            ]
        )

    def _completion(self, reply: Scripted) -> dict:
        message = {"role": "assistant", "content": reply.text}
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
        }

    def _chunk(self, delta: dict, finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": self.model, "choices": [choice]}
        return f"data: {json.dumps(chunk)}\n\n"

    async def _stream(self, reply: Scripted, usage: bool = False):
        done = False
        try:
            yield self._chunk({"role": "assistant", "content": ""})
            text = reply.text
            while text:
                piece, text = text[: self.chunk_chars], text[self.chunk_chars :]
                if not text and reply.loop:
                    text = reply.loop * 4
                self.chunks_sent += 1
                yield self._chunk({"content": piece})
                await asyncio.sleep(self.delay_s)
            yield self._chunk({}, reply.finish_reason)
            if usage:  # vLLM's last chunk with stream_options.include_usage: no choices, the usage
                tokens = max(1, len(reply.text) // 4)
                chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": self.model, "choices": []}
                yield f"data: {json.dumps(chunk | {'usage': {'completion_tokens': tokens}})}\n\n"
            yield "data: [DONE]\n\n"
            done = True
        finally:
            if done:
                self.finished += 1
            else:
                self.aborted += 1


def main() -> None:
    parser = argparse.ArgumentParser(prog="vllm")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args, ignored = parser.parse_known_args()
    print(f"fake vllm: serve {args.model} on {args.host}:{args.port} (ignoring {len(ignored)} args)", flush=True)
    if os.environ.get("FAKE_VLLM_FAIL"):
        print(os.environ["FAKE_VLLM_FAIL"], flush=True)
        sys.exit(1)
    os.execv(
        sys.executable,
        [
            sys.executable,
            "-m",
            "ocrserve",
            "engine",
            "serve",
            "--backend",
            "onnx",
            "--host",
            args.host,
            "--port",
            str(args.port),
            "--served-model-name",
            args.model,
            "--set",
            "preprocess.workers=1",
        ],
    )


if __name__ == "__main__":
    main()
