"""Request-body size limit, enforced before the body is parsed (ASGI middleware)."""

from __future__ import annotations

import json

from ocrserve.api.problems import count_too_large
from ocrserve.errors import PayloadTooLarge


class BodyLimitMiddleware:
    """Answer 413 to bodies above ``max_bytes``.

    A ``Content-Length`` above the limit is refused before reading anything; a body without one
    (chunked) is counted as it streams and refused once it passes the limit.

    Args:
        app: the wrapped ASGI app.
        max_bytes: largest accepted body, bytes.
    """

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

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
        response_started = False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
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

    async def _refuse(self, send) -> None:
        count_too_large()
        problem = self._problem()
        body = json.dumps(problem.to_dict()).encode()
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
