"""The gateway's HTTP/1.1 protocol: uvicorn's, with limits on request headers and problem-details
answers where uvicorn would answer in plain text.

uvicorn closes only idle keep-alive connections (``timeout_keep_alive``, between requests): a client
that connects and sends nothing, or sends its request headers a byte at a time (slowloris), holds
its connection, and a slot of the server's file descriptors, as long as it likes; and httptools
sets no bound on the headers' size. The request body has its own limits
(:mod:`ocrserve.api.body_limits`); this closes the gap before it.

uvicorn offers no public hook before the headers are complete (an ASGI app or middleware runs only
after), so this subclasses its httptools protocol, an internal of uvicorn: ``pyproject.toml`` pins
uvicorn to the releases tested and ``tests/test_uvicorn_private.py`` checks what this relies on.
"""

from __future__ import annotations

import asyncio
import json
import logging

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ocrserve.errors import BadRequest, ProblemError, RequestTimeout

log = logging.getLogger(__name__)


class HeadersTooLarge(ProblemError):
    """431 (RFC 6585 section 5): the request's header fields exceed ``server.max_header_kb``."""

    status = 431
    slug = "headers-too-large"
    title = "Request header fields too large"


class GatewayProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools, what uvicorn's ``http="auto"`` picks) with:

    - a header deadline: a request's headers must be complete within ``header_timeout_s`` seconds
      of its first byte (of the connection, for its first request). Past it the client gets a 408
      problem and the connection closes; a request pipelined behind one still being answered is
      dropped instead, and the connection closes after that answer;
    - a header size limit: more than ``max_header_bytes`` of header names and values is a 431
      problem, and the connection closes;
    - a malformed request (httptools cannot parse it) is a 400 problem, not uvicorn's plain text.

    Pass it to uvicorn as ``http=functools.partial(GatewayProtocol, header_timeout_s=...,
    max_header_bytes=...)``.

    Args:
        args, kwargs: uvicorn's protocol arguments (``config``, ``server_state``, ``app_state``).
        header_timeout_s: the deadline, seconds.
        max_header_bytes: the largest sum of header name and value lengths, bytes.
    """

    def __init__(self, *args, header_timeout_s: float, max_header_bytes: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.max_header_bytes = max_header_bytes
        self._header_deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._arm()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > self.max_header_bytes:
            raise self._headers_too_large()  # httptools stops; uvicorn calls send_400_response, below
        super().on_header(name, value)

    def _headers_too_large(self) -> HeadersTooLarge:
        return HeadersTooLarge(
            f"the request's header fields exceed server.max_header_kb={self.max_header_bytes // 1024} KiB"
        )

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request httptools could not parse (or whose headers were too large),
        as a problem; the connection closes."""
        if self._header_bytes > self.max_header_bytes:
            problem: ProblemError = self._headers_too_large()
        else:
            problem = BadRequest("the request is not valid HTTP/1.1 (malformed request line or header)")
        self._disarm()
        self.transport.write(self._problem_response(problem))
        self.transport.close()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        if self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing():
            return
        log.info(
            "closing a connection from %s: request headers incomplete after %g s", self.client, self.header_timeout_s
        )
        if self.cycle is None or self.cycle.response_complete:
            late = RequestTimeout(
                f"the request headers did not arrive within server.header_timeout_s={self.header_timeout_s:g} s"
            )
            self.transport.write(self._problem_response(late))
            self.transport.close()
        else:
            self.cycle.keep_alive = False

    def _problem_response(self, problem: ProblemError) -> bytes:
        """``problem`` as a problem-details response with ``Connection: close``, bytes on the wire."""
        body = json.dumps(problem.to_dict()).encode()
        headers = [
            *self.server_state.default_headers,
            (b"content-type", b"application/problem+json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        fields = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        return STATUS_LINE[problem.status] + fields + b"\r\n" + body
