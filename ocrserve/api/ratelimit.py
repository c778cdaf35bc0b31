"""Rate limits: token buckets by identity (an API key, a client address), in this process's memory
or in Redis, advertised in the IETF RateLimit header fields.

A token bucket holds up to ``burst`` tokens and gains ``rate`` tokens per second; a request takes
one, and is refused (429) when none is left. This is the bucket of RFC 2697 section 3 (committed
information rate CIR, committed burst size CBS), counted in requests instead of bytes. The
``limits`` library was the first choice, but its strategies (fixed window, moving window, sliding
window counter) count a whole number of requests per fixed period; none refills continuously at a
fractional rate with a burst size of its own, which is what ``requests_per_s`` and ``burst`` mean.

Every response of a limited request carries the fields of draft-ietf-httpapi-ratelimit-headers-10
("RateLimit header fields for HTTP"; Structured Fields, RFC 9651), e.g.::

    RateLimit-Policy: "requests";q=20;w=10
    RateLimit: "requests";r=19;t=1

A bucket is told as the quota ``q`` = ``burst`` over the window ``w`` it takes to refill from empty
(seconds, rounded up); ``r`` is the requests it allows now and ``t`` the seconds until it is full
again. A refusal adds ``Retry-After`` (RFC 9110 section 10.2.3): the seconds until one token is back.

Where the buckets live depends on the job store (``store.url``):

- **SQLite** (or no store shared): in each gateway process's memory (:class:`RateLimiter`);
  gateways side by side each allow the full rate.
- **Redis**: in Redis (:class:`SharedRateLimiter` over :class:`ocrserve.store.buckets.RedisBuckets`),
  one bucket per policy and identity for every gateway on that Redis, weighed by one Lua script
  (atomic, timed by the Redis server's clock), so N gateways together allow the rate once.
  When Redis fails a check (unreachable, or no answer within 0.5 s) the request is weighed against
  this gateway's own in-memory bucket instead (which starts full), logged once as a WARNING when it
  starts and once when Redis answers again; Redis is tried again at most every
  :data:`SHARED_RETRY_S`. Requests are neither all refused nor let through unlimited while Redis is
  down: each gateway enforces the limit on its own, as with SQLite.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.datastructures import MutableHeaders
from starlette.requests import Request

from ocrserve.store.buckets import BucketsUnavailable, RedisBuckets

log = logging.getLogger(__name__)

#: Buckets a :class:`RateLimiter` keeps before it first drops full ones (which lose nothing).
PRUNE_AT = 4096
#: Attribute of ``request.state`` holding the RateLimit fields for the request's response.
STATE_ATTRIBUTE = "ratelimit_fields"
#: Seconds a :class:`SharedRateLimiter` weighs requests in memory after Redis failed a check,
#: before it asks Redis again.
SHARED_RETRY_S = 1.0


@dataclass(frozen=True)
class Limit:
    """A token-bucket policy.

    Attributes:
        name: its identifier in the header fields.
        rate: tokens gained per second (> 0).
        burst: the bucket's size, tokens (>= 1).
        setting: the configuration it comes from, named in refusals.
    """

    name: str
    rate: float
    burst: int
    setting: str

    @property
    def window_s(self) -> int:
        """Seconds an empty bucket takes to fill, rounded up (the policy's ``w``)."""
        return max(1, math.ceil(self.burst / self.rate))

    def policy_field(self) -> str:
        """The ``RateLimit-Policy`` member of this policy."""
        return f'"{self.name}";q={self.burst};w={self.window_s}'


@dataclass
class TokenBucket:
    """One identity's bucket under a :class:`Limit`, refilled lazily from a monotonic clock.

    Attributes:
        tokens: tokens at ``stamp``, at most ``limit.burst``.
        stamp: clock reading (seconds) of the last refill.
    """

    limit: Limit
    tokens: float
    stamp: float

    def refill(self, now: float) -> None:
        """Add the tokens gained since :attr:`stamp`."""
        self.tokens = min(self.limit.burst, self.tokens + (now - self.stamp) * self.limit.rate)
        self.stamp = now

    def wait_s(self) -> float:
        """Seconds until one token is there (0 when one is)."""
        return max(0.0, (1 - self.tokens) / self.limit.rate)

    def full_in_s(self) -> float:
        """Seconds until the bucket is full."""
        return (self.limit.burst - self.tokens) / self.limit.rate


@dataclass(frozen=True)
class Verdict:
    """A request weighed against a :class:`Limit`.

    Attributes:
        allowed: whether a token was there (and, for :meth:`RateLimiter.take`, taken).
        retry_after_s: whole seconds until a token is back (0 when allowed).
        headers: ``RateLimit-Policy`` and ``RateLimit``, and ``Retry-After`` when refused.
    """

    allowed: bool
    retry_after_s: int
    headers: dict[str, str]


class RateLimiter:
    """Token buckets by identity. Not thread-safe: call it from the event loop only.

    Memory: a bucket that has refilled is dropped once :data:`PRUNE_AT` (or twice the buckets left at
    the last pruning) are kept, so it holds about the identities seen within one refill window.

    Args:
        clock: monotonic seconds (default ``time.monotonic``).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._prune_at = PRUNE_AT

    def take(self, identity: str, limit: Limit) -> Verdict:
        """Take a token from ``identity``'s bucket if it has one."""
        return self._weigh(identity, limit, take=True)

    def peek(self, identity: str, limit: Limit) -> Verdict:
        """Whether ``identity``'s bucket has a token, taking none."""
        return self._weigh(identity, limit, take=False)

    def _weigh(self, identity: str, limit: Limit, *, take: bool) -> Verdict:
        now = self._clock()
        bucket = self._buckets.get(identity)
        if bucket is None:
            self._prune(now)
            bucket = self._buckets[identity] = TokenBucket(limit, float(limit.burst), now)
        bucket.refill(now)
        allowed = bucket.tokens >= 1
        if allowed and take:
            bucket.tokens -= 1
        return verdict_of(bucket, allowed)

    def _prune(self, now: float) -> None:
        if len(self._buckets) < self._prune_at:
            return
        for identity, bucket in list(self._buckets.items()):
            bucket.refill(now)
            if bucket.tokens >= bucket.limit.burst:
                del self._buckets[identity]
        self._prune_at = max(PRUNE_AT, 2 * len(self._buckets))


def verdict_of(bucket: TokenBucket, allowed: bool) -> Verdict:
    """The :class:`Verdict` on a request, ``allowed`` or not, that left ``bucket`` as it is."""
    retry_after = 0 if allowed else max(1, math.ceil(bucket.wait_s()))
    headers = {
        "RateLimit-Policy": bucket.limit.policy_field(),
        "RateLimit": f'"{bucket.limit.name}";r={math.floor(bucket.tokens)};t={math.ceil(bucket.full_in_s())}',
    }
    if not allowed:
        headers["Retry-After"] = str(retry_after)
    return Verdict(allowed, retry_after, headers)


class SharedRateLimiter:
    """Token buckets by identity in Redis, one per policy and identity for every gateway on it;
    this process's own :class:`RateLimiter` while Redis fails (see the module docstring).

    Args:
        buckets: the buckets in Redis (:func:`ocrserve.store.open_buckets`).
        clock: monotonic seconds, for :data:`SHARED_RETRY_S` and the fallback buckets.
    """

    def __init__(self, buckets: RedisBuckets, clock: Callable[[], float] = time.monotonic):
        self.buckets = buckets
        self.local = RateLimiter(clock)
        self._clock = clock
        self._local_until: float | None = None  # while set, Redis failed: weigh locally until then

    async def take(self, identity: str, limit: Limit) -> Verdict:
        """Take a token from ``identity``'s bucket under ``limit`` if it has one."""
        return await self._weigh(identity, limit, take=True)

    async def peek(self, identity: str, limit: Limit) -> Verdict:
        """Whether ``identity``'s bucket under ``limit`` has a token, taking none."""
        return await self._weigh(identity, limit, take=False)

    async def _weigh(self, identity: str, limit: Limit, *, take: bool) -> Verdict:
        name = f"{limit.name}:{identity}"
        if self._local_until is not None and self._clock() < self._local_until:
            return self.local.take(name, limit) if take else self.local.peek(name, limit)
        try:
            allowed, tokens = await self.buckets.weigh(name, limit.rate, limit.burst, take=take)
        except BucketsUnavailable as exc:
            if self._local_until is None:
                log.warning(
                    "rate limits: Redis at %s failed a check (%s); each gateway limits on its own "
                    "until it answers again",
                    self.buckets.url,
                    exc,
                )
            self._local_until = self._clock() + SHARED_RETRY_S
            return self.local.take(name, limit) if take else self.local.peek(name, limit)
        if self._local_until is not None:
            log.warning("rate limits: Redis at %s answers again; limits are shared again", self.buckets.url)
            self._local_until = None
        return verdict_of(TokenBucket(limit, tokens, 0.0), allowed)

    async def close(self) -> None:
        """Close the connections to Redis."""
        await self.buckets.close()


def advertise(request: Request, verdict: Verdict) -> None:
    """Have the request's response carry ``verdict``'s RateLimit fields (see :class:`RateLimitHeaders`)."""
    setattr(request.state, STATE_ATTRIBUTE, {k: v for k, v in verdict.headers.items() if k != "Retry-After"})


class RateLimitHeaders:
    """Pure ASGI middleware: adds the fields :func:`advertise` left for a request to its response
    (every response, streams and problems included), unless the response set them itself."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_fields(message):
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in getattr(Request(scope).state, STATE_ATTRIBUTE, {}).items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_fields)
