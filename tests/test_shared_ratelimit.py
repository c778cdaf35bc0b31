"""Rate limits shared through Redis: the token bucket's Lua script on a real redis-server through
redis-py, the fallback to this process's buckets when Redis is gone, and two real gateways on one
Redis that together allow one key's burst once."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
import redis.asyncio as aioredis

from ocrserve.api.ratelimit import Limit, RateLimiter, SharedRateLimiter
from ocrserve.bench.harness import free_port
from ocrserve.config import StoreConfig
from ocrserve.store import open_buckets
from ocrserve.store.buckets import BucketsUnavailable, RedisBuckets
from tests.conftest import Gateway
from tests.redis_server import redis_url  # noqa: F401  (fixture)
from tests.test_api import assert_problem

pytestmark = pytest.mark.redis


async def test_lua_bucket_takes_a_burst_then_refills_at_the_rate(redis_url):  # noqa: F811
    buckets = RedisBuckets(redis_url, prefix="lua-test")
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        weighed = [await buckets.weigh("requests:k", 2.0, 3, take=True) for _ in range(4)]
        assert [allowed for allowed, _ in weighed] == [True, True, True, False]
        assert [round(tokens) for _, tokens in weighed] == [2, 1, 0, 0]
        assert weighed[3][1] < 1  # refused: no whole token, some refill since the third
        held = await client.hgetall("lua-test:ratelimit:requests:k")
        assert set(held) == {"tokens", "stamp"}
        ttl_ms = await client.pttl("lua-test:ratelimit:requests:k")
        assert 0 < ttl_ms <= 1500  # three tokens at 2/s: full again within 1.5 s, then it vanishes
        peeked = await buckets.weigh("requests:k", 2.0, 3, take=False)
        assert peeked[0] is False and await client.hget("lua-test:ratelimit:requests:k", "tokens") == held["tokens"]
        assert (await buckets.weigh("requests:other", 2.0, 3, take=True))[0]  # one bucket per name
        assert not await client.exists("lua-test:ratelimit:requests:never")
        assert await buckets.weigh("requests:never", 2.0, 3, take=False) == (True, 3.0)  # absent = full
        assert not await client.exists("lua-test:ratelimit:requests:never")  # looking stores nothing
        await asyncio.sleep(0.6)  # 1.2 tokens back at 2/s
        allowed, tokens = await buckets.weigh("requests:k", 2.0, 3, take=True)
        assert allowed and 0.1 < tokens < 1
        await asyncio.sleep(ttl_ms / 1000 + 0.6)
        assert not await client.exists("lua-test:ratelimit:requests:other")  # idle and full: expired
    finally:
        await buckets.close()
        await client.aclose()


async def test_shared_limiter_headers_match_the_in_memory_ones(redis_url):  # noqa: F811
    limit = Limit("requests", rate=0.5, burst=3, setting="test")
    shared = SharedRateLimiter(RedisBuckets(redis_url, prefix="headers-test"))
    local = RateLimiter()
    try:
        for _ in range(4):
            remote, here = await shared.take("k", limit), local.take("k", limit)
            assert (remote.allowed, remote.retry_after_s, remote.headers) == (
                here.allowed,
                here.retry_after_s,
                here.headers,
            )
        assert remote.headers["Retry-After"] == "2" and remote.headers["RateLimit"] == '"requests";r=0;t=6'
    finally:
        await shared.close()


async def test_redis_gone_falls_back_to_this_gateways_buckets_and_logs_once(caplog):
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert isinstance(open_buckets(StoreConfig(url=dead)), RedisBuckets)
    assert open_buckets(StoreConfig(url="sqlite:///jobs.db")) is None  # in memory, per gateway
    buckets = RedisBuckets(dead)
    with pytest.raises(BucketsUnavailable, match="ConnectionError"):
        await buckets.weigh("requests:k", 1.0, 2, take=True)
    shared = SharedRateLimiter(buckets)
    limit = Limit("requests", rate=0.01, burst=2, setting="test")
    with caplog.at_level(logging.WARNING, logger="ocrserve.api.ratelimit"):
        verdicts = [await shared.take("k", limit) for _ in range(3)]
    assert [v.allowed for v in verdicts] == [True, True, False]  # still limited, by this process
    assert verdicts[2].headers["Retry-After"] == "100"
    warnings = [r.getMessage() for r in caplog.records if r.name == "ocrserve.api.ratelimit"]
    assert len(warnings) == 1 and dead in warnings[0] and "limits on its own" in warnings[0], warnings
    await shared.close()


@pytest.fixture(scope="module")
def gateways(redis_url, tmp_path_factory):  # noqa: F811
    """Two gateways sharing one Redis (and data folder); one key limited to a burst of 3 at 0.05/s."""
    data = tmp_path_factory.mktemp("shared-limits")
    settings = (
        f"store.url={redis_url}",
        "store.key_prefix=shared-limits",
        f"store.data_dir={data}",
        "server.api_keys=[{key: shared-key, tenant: shared, requests_per_s: 0.05, burst: 3}]",
    )
    pair = [Gateway(*settings), Gateway(*settings)]
    try:
        yield [gw.wait_ready() for gw in pair]
    finally:
        for gw in pair:
            gw.stop()


def test_two_gateways_on_one_redis_share_one_limit_per_key(gateways):
    first, second = gateways
    key = {"Authorization": "Bearer shared-key"}
    answers = [httpx.get(gw.url + "/v1/models", headers=key, timeout=30) for gw in (first, second, first, second)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429], [a.text for a in answers]
    assert [a.headers["ratelimit"].split(";t=")[0] for a in answers] == [f'"requests";r={n}' for n in (2, 1, 0, 0)]
    assert {a.headers["ratelimit-policy"] for a in answers} == {'"requests";q=3;w=60'}
    refused = assert_problem(answers[3], 429, r"too many requests of this API key: at most 3 at once")
    assert refused["type"].endswith("/rate-limited")
    assert 1 <= int(answers[3].headers["retry-after"]) <= 20  # a token every 20 s
    again = httpx.get(first.url + "/v1/models", headers=key, timeout=30)  # the other gateway: refused too
    assert again.status_code == 429 and "retry-after" in again.headers
