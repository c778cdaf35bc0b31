"""Request ids: every request gets one, sees it in its ``X-Request-ID`` response header, and every
log line made while it runs carries it (:mod:`ocrserve.logs`); and the instant it arrived."""

from __future__ import annotations

import time

from starlette.datastructures import Headers, MutableHeaders

from ocrserve.logs import REQUEST_ID_HEADER, accept_request_id, request_scope


class RequestIdMiddleware:
    """Pure ASGI middleware, outermost (:class:`ocrserve.api.app.GatewayApp`): takes the request's
    ``X-Request-ID`` when it is valid or makes one (:func:`ocrserve.logs.accept_request_id`), keeps
    it in ``request.state.request_id`` and as the current request id while the request runs
    (uvicorn's access line included), and returns it in the ``X-Request-ID`` response header.
    ``request.state.arrived`` is when the request arrived (``time.monotonic()``), before its body
    was read: a client's ``timeout`` runs from then, as the client's own clock does."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = accept_request_id(Headers(scope=scope).get(REQUEST_ID_HEADER))
        state = scope.setdefault("state", {})
        state["request_id"], state["arrived"] = request_id, time.monotonic()

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        with request_scope(request_id):
            await self.app(scope, receive, send_with_id)
