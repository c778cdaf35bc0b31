"""Request counting and latency per route template (pure ASGI, so streaming and disconnect
detection pass through untouched)."""

from __future__ import annotations

import time

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
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            metrics.REQUESTS.labels(template, str(status)).inc()
            metrics.REQUEST_SECONDS.labels(template).observe(time.perf_counter() - started)
