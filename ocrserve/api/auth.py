"""API-key authentication (``Authorization: Bearer <key>`` or ``X-API-Key: <key>``), tenants and
rate limits.

:class:`Gate` finds whom a request acts for (:mod:`ocrserve.api.tenants`) and weighs it against
two kinds of token bucket (:mod:`ocrserve.api.ratelimit`): each key's requests
(``server.rate_limit.requests_per_s``; with no keys, each client address's), and each client
address's failed authentications (``failed_auth_per_s``). An address that used up the latter gets
429 for every request, valid key or not, until its bucket refills: a client guessing keys learns
nothing from answers beyond its allowance. Behind a reverse proxy the address is the proxy's unless
uvicorn trusts its ``X-Forwarded-For`` (``--forwarded-allow-ips``).

With the Redis store the buckets are in Redis, shared by every gateway on it; with SQLite they are
in this process's memory (:mod:`ocrserve.api.ratelimit`).
"""

from __future__ import annotations

from fastapi import FastAPI, Request

from ocrserve.api.problems import problem_response
from ocrserve.api.ratelimit import Limit, RateLimiter, SharedRateLimiter, Verdict, advertise
from ocrserve.api.tenants import KeyRing, Principal
from ocrserve.config import Config
from ocrserve.errors import ProblemError, TooManyRequests
from ocrserve.store import open_buckets

#: ``request.state`` attribute holding the request's :class:`Principal` once authenticated.
PRINCIPAL_ATTRIBUTE = "principal"
#: Policy name of the failed-authentication limit in the RateLimit fields.
FAILED_AUTH_POLICY = "failed-auth"
FAILED_AUTH_SETTING = "server.rate_limit.failed_auth_per_s and failed_auth_burst"
#: The Prometheus route, which ``server.protect_ops`` guards besides FastAPI's documentation.
METRICS_PATH = "/metrics"


class Unauthorized(ProblemError):
    """401: no credentials were sent."""

    status = 401
    slug = "unauthorized"
    title = "Unauthorized"


class Forbidden(ProblemError):
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


def client_address(request: Request) -> str:
    """The client's IP address as uvicorn reports it ("unknown" without one)."""
    return request.client.host if request.client else "unknown"


#: The header a client may name itself with (``router.fair_by: header``).
CLIENT_ID_HEADER = "x-client-id"
#: Characters of a client's name kept (it labels nothing; it only has to tell clients apart).
CLIENT_ID_CHARS = 128


def client_of(request: Request, fair_by: str) -> str:
    """Whom the router shares the engine between, for ``router.fair_by``: the request's tenant when
    API keys are on; else ``X-Client-Id`` (with ``header``) or the client address; ``""`` (one
    client) with ``off``."""
    if fair_by == "off":
        return ""
    principal = getattr(request.state, PRINCIPAL_ATTRIBUTE, None)
    if principal is not None and principal.key_sha256:
        return "tenant:" + principal.tenant
    named = request.headers.get(CLIENT_ID_HEADER, "").strip() if fair_by == "header" else ""
    return "client:" + named[:CLIENT_ID_CHARS] if named else "address:" + client_address(request)


class Gate:
    """Authentication and rate limits of one gateway process (its buckets in Redis with the Redis
    store, else in memory).

    Args:
        config: the profile (``server.api_keys``, ``server.rate_limit``, ``jobs.max_queued_pages_per_tenant``,
            ``store.url`` and ``store.key_prefix``).

    Raises:
        ImportError: a redis:// ``store.url`` without redis-py installed.
    """

    def __init__(self, config: Config):
        self.keys = KeyRing(config)
        limits = config.server.rate_limit
        self.failed_auth = (
            Limit(FAILED_AUTH_POLICY, limits.failed_auth_per_s, limits.failed_auth_burst, FAILED_AUTH_SETTING)
            if limits.failed_auth_per_s
            else None
        )
        buckets = open_buckets(config.store)
        # one SharedRateLimiter holds both policies: its bucket names start with the policy's
        self.requests = self.failures = SharedRateLimiter(buckets) if buckets else _Local()

    async def close(self) -> None:
        """Close the connections to Redis (none with buckets in memory)."""
        if isinstance(self.requests, SharedRateLimiter):
            await self.requests.close()

    async def authenticate(self, request: Request) -> Principal:
        """Whom ``request`` acts for; the first call per request checks and counts it, later ones
        return the same principal.

        Raises:
            Unauthorized: keys are configured and none was sent.
            Forbidden: the key sent is none of them.
            TooManyRequests: the key's (or, without keys, the address's) requests, or the
                address's failed authentications, are over their limit.
        """
        known = getattr(request.state, PRINCIPAL_ATTRIBUTE, None)
        if known is not None:
            return known
        address = client_address(request)
        principal = await self._identify(request, address) if self.keys else self.keys.anonymous
        if principal.limit is not None:
            verdict = await self.requests.take(principal.key_sha256 or address, principal.limit)
            advertise(request, verdict)
            if not verdict.allowed:
                raise _refusal(verdict, principal.limit, "requests of this API key" if self.keys else "requests")
        setattr(request.state, PRINCIPAL_ATTRIBUTE, principal)
        return principal

    async def _identify(self, request: Request, address: str) -> Principal:
        """The principal of the request's key, counting a failure against ``address``."""
        if self.failed_auth is not None:
            verdict = await self.failures.peek(address, self.failed_auth)
            if not verdict.allowed:
                advertise(request, verdict)
                raise _refusal(verdict, self.failed_auth, f"failed authentications from {address}")
        key = presented_key(request)
        principal = self.keys.match(key) if key is not None else None
        if principal is not None:
            return principal
        headers = {}
        if self.failed_auth is not None:
            verdict = await self.failures.take(address, self.failed_auth)
            advertise(request, verdict)
            headers = verdict.headers
        if key is None:
            raise Unauthorized(
                "send Authorization: Bearer <key> or X-API-Key", headers={**headers, "WWW-Authenticate": "Bearer"}
            )
        raise Forbidden("the API key is not valid", headers=headers)


def _refusal(verdict: Verdict, limit: Limit, what: str) -> TooManyRequests:
    """The 429 of ``what`` over ``limit``."""
    return TooManyRequests(
        f"too many {what}: at most {limit.burst} at once and {limit.rate:g} per second ({limit.setting}); "
        f"retry in {verdict.retry_after_s} s",
        headers=verdict.headers,
    )


class _Local:
    """In-memory buckets (:class:`RateLimiter`, one per policy) behind :class:`SharedRateLimiter`'s
    awaitable interface."""

    def __init__(self):
        self._limiters: dict[str, RateLimiter] = {}

    async def take(self, identity: str, limit: Limit) -> Verdict:
        return self._limiters.setdefault(limit.name, RateLimiter()).take(identity, limit)

    async def peek(self, identity: str, limit: Limit) -> Verdict:
        return self._limiters.setdefault(limit.name, RateLimiter()).peek(identity, limit)


def principal_of(request: Request) -> Principal:
    """Whom ``request`` acts for, once :func:`require_api_key` has passed it.

    Raises:
        RuntimeError: the request was not authenticated (a route without the dependency).
    """
    principal = getattr(request.state, PRINCIPAL_ATTRIBUTE, None)
    if principal is None:
        raise RuntimeError(f"{request.url.path}: principal_of before require_api_key")
    return principal


async def require_api_key(request: Request) -> Principal:
    """FastAPI dependency: authenticate and rate-limit the request (:meth:`Gate.authenticate`,
    whose errors it raises); passes every request as the anonymous tenant when ``server.api_keys``
    is empty."""
    return await request.app.state.gate.authenticate(request)


def ops_paths(app: FastAPI) -> frozenset[str]:
    """What ``server.protect_ops`` guards: ``/metrics`` and the app's OpenAPI schema and documentation."""
    urls = (METRICS_PATH, app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)
    return frozenset(url for url in urls if url)


class ProtectOps:
    """Pure ASGI middleware (``server.protect_ops``): requests for ``paths`` are authenticated and
    limited as the API's are, and refused with the same problems.

    Args:
        app: the ASGI app inside.
        paths: the guarded paths (:func:`ops_paths`).
    """

    def __init__(self, app, paths: frozenset[str]):
        self.app = app
        self.paths = paths

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] in self.paths:
            try:
                await require_api_key(Request(scope, receive))
            except ProblemError as problem:
                return await problem_response(problem)(scope, receive, send)
        await self.app(scope, receive, send)
