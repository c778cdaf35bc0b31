"""Request counting and latency per route template (pure ASGI, so streaming and disconnect
detection pass through untouched)."""

from __future__ import annotations

import time

from starlette.routing import Match

from ocrserve import metrics


class MetricsMiddleware:
    """Count each HTTP request by route template and status, and time it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500

        async def send_and_record(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            template = _template(scope)
            metrics.REQUESTS.labels(template, str(status)).inc()
            metrics.REQUEST_SECONDS.labels(template).observe(time.perf_counter() - started)


def _template(scope) -> str:
    """The route template that served ``scope``: the one FastAPI recorded, else the app's plain
    Starlette route that matches (``/docs``, ``/openapi.json``), else ``unmatched``."""
    route = scope.get("route")
    if route is not None:
        return route.path
    app = scope.get("app")
    for candidate in getattr(app, "routes", ()):
        if candidate.matches(scope)[0] is Match.FULL:
            return getattr(candidate, "path", "unmatched")
    return "unmatched"
