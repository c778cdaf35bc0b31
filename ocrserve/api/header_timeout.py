"""A deadline on each request's headers, so a slow client cannot hold a connection forever.

uvicorn closes only idle keep-alive connections (``timeout_keep_alive``, between requests): a client
that connects and sends nothing, or sends its request headers a byte at a time (slowloris), holds
its connection, and a slot of the server's file descriptors, as long as it likes. The request body
has its own limit (``server.read_timeout_s``, :mod:`ocrserve.api.limits`); this closes the gap
before it.
"""

from __future__ import annotations

import asyncio
import json
import logging

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ocrserve.errors import RequestTimeout

log = logging.getLogger(__name__)


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools, what uvicorn's ``http="auto"`` picks) with a header
    deadline: a request's headers must be complete within ``header_timeout_s`` seconds of its first
    byte (of the connection, for its first request). Past it the client gets a 408 problem and the
    connection closes; a request pipelined behind one still being answered is dropped instead,
    and the connection closes after that answer.

    Pass it to uvicorn as ``http=functools.partial(HeaderTimeoutProtocol, header_timeout_s=...)``.

    Args:
        args, kwargs: uvicorn's protocol arguments (``config``, ``server_state``, ``app_state``).
        header_timeout_s: the deadline, seconds.
    """

    def __init__(self, *args, header_timeout_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

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
            self.transport.write(self._timeout_response())
            self.transport.close()
        else:
            self.cycle.keep_alive = False

    def _timeout_response(self) -> bytes:
        """The 408 problem-details response, ``Connection: close``, as bytes on the wire."""
        problem = RequestTimeout(
            f"the request headers did not arrive within server.header_timeout_s={self.header_timeout_s:g} s"
        )
        body = json.dumps(problem.to_dict()).encode()
        headers = [
            *self.server_state.default_headers,
            (b"content-type", b"application/problem+json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        return STATUS_LINE[408] + b"".join(name + b": " + value + b"\r\n" for name, value in headers) + b"\r\n" + body
