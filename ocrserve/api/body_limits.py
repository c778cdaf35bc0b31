"""Request-body limits, enforced before the body is parsed (ASGI middleware): its size, and how
long a client may pause while sending it; after a large body, its memory goes back to the kernel."""

from __future__ import annotations

import json

from ocrserve import heap
from ocrserve.alarm import within
from ocrserve.api.problems import count_too_large, problem_body
from ocrserve.errors import PayloadTooLarge, RequestTimeout


class BodyLimitMiddleware:
    """Answer 413 to bodies above ``max_bytes``, and 408 to a body whose next part does not arrive
    within ``read_timeout_s`` (a slow client cannot hold a connection and its upload forever).

    A ``Content-Length`` above the limit is refused before reading anything; a body without one
    (chunked) is counted as it streams and refused once it passes the limit.

    Args:
        app: the wrapped ASGI app.
        max_bytes: largest accepted body, bytes.
        read_timeout_s: longest wait for the next part of the body, seconds.
    """

    def __init__(self, app, max_bytes: int, read_timeout_s: float):
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s

    def _problem(self) -> PayloadTooLarge:
        mib = self.max_bytes / (1 << 20)
        return PayloadTooLarge(f"the request body exceeds server.max_upload_mb={mib:g} MiB", slug="too-many-bytes")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(send)
        seen = 0
        body_done = False
        response_started = False

        async def counted_receive():
            nonlocal seen, body_done
            if body_done:  # what follows is only http.disconnect, which may be waited for as long as needed
                return await receive()
            message = await self._receive_within(receive)
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if seen > self.max_bytes:
                    raise self._problem()
            return message

        async def tracking_send(message):
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracking_send)
        except PayloadTooLarge:
            if not response_started:
                await self._refuse(send)
        finally:
            if seen >= heap.LARGE_BODY_BYTES:
                heap.trim()  # the body's copies (raw, parsed, spooled) are freed by now

    async def _receive_within(self, receive) -> dict:
        """The next ASGI message, waited for at most ``read_timeout_s``.

        Raises:
            RequestTimeout: nothing arrived in time.
        """
        try:
            return await within(receive(), self.read_timeout_s)
        except TimeoutError:
            raise RequestTimeout(
                f"the request body stopped arriving: nothing for server.read_timeout_s={self.read_timeout_s:g} s"
            ) from None

    async def _refuse(self, send) -> None:
        count_too_large()
        problem = self._problem()
        body = json.dumps(problem_body(problem)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/problem+json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
