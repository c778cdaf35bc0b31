"""API-key authentication: ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``."""

from __future__ import annotations

import hmac

from fastapi import Request

from ocrserve.errors import Problem


class Unauthorized(Problem):
    """401: no credentials were sent."""

    status = 401
    slug = "unauthorized"
    title = "Unauthorized"


class Forbidden(Problem):
    """403: the credentials sent are not valid."""

    status = 403
    slug = "forbidden"
    title = "Forbidden"


def presented_key(request: Request) -> str | None:
    """The key the client sent, if any."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token:
        return token.strip()
    return request.headers.get("x-api-key")


async def require_api_key(request: Request) -> None:
    """FastAPI dependency: pass when ``server.api_keys`` is empty or the key matches one.

    Raises:
        Unauthorized: keys are configured and none was sent.
        Forbidden: the key sent matches none (compared in constant time).
    """
    keys: list[str] = request.app.state.config.server.api_keys
    if not keys:
        return
    key = presented_key(request)
    if key is None:
        raise Unauthorized("send Authorization: Bearer <key> or X-API-Key", headers={"WWW-Authenticate": "Bearer"})
    if not any(hmac.compare_digest(key.encode(), k.encode()) for k in keys):
        raise Forbidden("the API key is not valid")
