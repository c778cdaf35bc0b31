"""Token buckets in Redis, shared by every gateway on one Redis store (``store.url``), for the
rate limits of :mod:`ocrserve.api.ratelimit`.

Each bucket is one hash, ``P:ratelimit:{name}`` (``P`` = ``store.key_prefix``) holding ``tokens``
and ``stamp``, weighed and changed by one Lua script (``lua/ratelimit.lua``), so concurrent
requests on several gateways take tokens from it atomically, timed by the Redis server's clock
(``TIME``). A bucket expires once it would be full again: idle identities cost no memory.

redis-py (an optional extra) is imported when a :class:`RedisBuckets` is made, so this module, and
:class:`BucketsUnavailable`, import without it.
"""

from __future__ import annotations

#: The script, ``lua/ratelimit.lua`` (run after ``lua/common.lua``, as the job store's are).
SCRIPT = "ratelimit"
#: Seconds a connection to Redis, and each call on it, may take before the call fails
#: (:class:`BucketsUnavailable`): a rate-limit check must not hold a request up for long.
TIMEOUT_S = 0.5


class BucketsUnavailable(Exception):
    """Redis did not answer a bucket's call (unreachable, timed out, refusing the script)."""


class RedisBuckets:
    """Token buckets in Redis.

    Args:
        url: ``redis://host:port/db`` (or ``rediss://``, ``unix://``), the job store's.
        prefix: namespace of every key (``store.key_prefix``).
        timeout_s: seconds to connect, and seconds each call may take.
    """

    def __init__(self, url: str, prefix: str = "ocrserve", timeout_s: float = TIMEOUT_S):
        import redis.asyncio as aioredis
        from redis.exceptions import RedisError

        from ocrserve.store.redis_store import lua_source

        self.url = url
        self.prefix = prefix
        self._errors = (RedisError, OSError)
        # no retries: a failed call falls back at once (the caller decides how)
        self._redis = aioredis.Redis.from_url(
            url, decode_responses=True, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._script = self._redis.register_script(lua_source(SCRIPT))

    async def weigh(self, name: str, rate: float, burst: int, *, take: bool) -> tuple[bool, float]:
        """Refill bucket ``name`` to the server's clock and, with ``take``, take a token if one is there.

        Args:
            name: the bucket (a policy and an identity).
            rate: tokens gained per second (> 0).
            burst: the bucket's size, tokens (>= 1); a new bucket starts full.
            take: take a token (else only look).

        Returns:
            ``(allowed, tokens)``: whether a token was there, and the tokens left (fractional).

        Raises:
            BucketsUnavailable: Redis failed the call (the message says how).
        """
        try:
            allowed, tokens = await self._script(args=[self.prefix, name, repr(float(rate)), burst, int(take)])
        except self._errors as exc:
            raise BucketsUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return bool(allowed), float(tokens)

    async def close(self) -> None:
        """Close the connections."""
        await self._redis.aclose()
