"""Tenants, rate limits and quotas: the token bucket on a clock the test moves, the key ring, the
stores' per-tenant counting (SQLite and a real redis-server), and a real gateway with several keys."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
import uuid

import httpx
import pytest

from ocrserve.api.ratelimit import Limit, RateLimiter
from ocrserve.api.tenants import KeyRing
from ocrserve.config import ConfigError, load_config
from ocrserve.errors import TooManyRequests
from ocrserve.store.base import IdempotencyConflict
from ocrserve.store.job_records import ANONYMOUS, Job
from ocrserve.store.sqlite_store import SqliteStore
from tests.conftest import Gateway
from tests.jobs_util import metric, numbered_tiff, read_events, wait_job
from tests.redis_server import redis_url  # noqa: F401  (fixture)
from tests.test_api import assert_problem
from tests.test_jobs_store import LEASE, make_job, ok, store  # noqa: F401  (store: fixture)

GAMMA_SHA256 = hashlib.sha256(b"gamma-key").hexdigest()
KEYS = (
    "[alpha-key, {key: beta-key, tenant: beta}, "
    f"{{key_sha256: '{GAMMA_SHA256}', tenant: beta}}, "
    "{key: limited-key, tenant: limited, requests_per_s: 2, burst: 3}, "
    "{key: quota-key, tenant: quota, max_queued_pages: 20}]"
)


# the token bucket -------------------------------------------------------------------------------


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_allows_a_burst_then_the_rate():
    clock = Clock()
    limiter = RateLimiter(clock)
    limit = Limit("requests", rate=2.0, burst=3, setting="test")
    verdicts = [limiter.take("k", limit) for _ in range(4)]
    assert [v.allowed for v in verdicts] == [True, True, True, False]
    assert verdicts[0].headers == {"RateLimit-Policy": '"requests";q=3;w=2', "RateLimit": '"requests";r=2;t=1'}
    refused = verdicts[3]
    assert refused.retry_after_s == 1 and refused.headers["Retry-After"] == "1"
    assert refused.headers["RateLimit"] == '"requests";r=0;t=2'
    assert limiter.take("other", limit).allowed  # one bucket per identity
    clock.now += 0.5  # one token back at 2 per second
    assert limiter.take("k", limit).allowed and not limiter.take("k", limit).allowed
    clock.now += 60
    assert [limiter.take("k", limit).allowed for _ in range(4)] == [True, True, True, False]  # never above burst


def test_peek_takes_nothing():
    limiter = RateLimiter(Clock())
    limit = Limit("failed-auth", rate=1.0, burst=1, setting="test")
    assert limiter.peek("a", limit).allowed and limiter.peek("a", limit).allowed
    assert limiter.take("a", limit).allowed
    assert not limiter.peek("a", limit).allowed


# keys and tenants ---------------------------------------------------------------------------------


def test_key_ring_tenants_hashes_and_overrides():
    ring = KeyRing(
        load_config(
            "local", [f"server.api_keys={KEYS}", "server.rate_limit.requests_per_s=5", "server.rate_limit.burst=7"]
        )
    )
    alpha = ring.match("alpha-key")
    assert alpha.tenant == "key-" + hashlib.sha256(b"alpha-key").hexdigest()[:8]
    assert alpha.key_sha256 == hashlib.sha256(b"alpha-key").hexdigest()
    assert (alpha.limit.rate, alpha.limit.burst, alpha.max_queued_pages) == (5, 7, 0)
    assert ring.match("beta-key").tenant == ring.match("gamma-key").tenant == "beta"
    assert ring.match(GAMMA_SHA256) is None  # the hash is not the key
    assert ring.match("nope") is None
    limited = ring.match("limited-key")
    assert (limited.limit.rate, limited.limit.burst) == (2, 3) and "limited" in limited.limit.setting
    assert ring.match("quota-key").max_queued_pages == 20
    assert bool(ring) and not KeyRing(load_config("local"))
    assert KeyRing(load_config("local")).anonymous.tenant == ANONYMOUS


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("[a, {key: a, tenant: t}]", "entries 0 and 1 are the same key"),
        (f"[{{key: gamma-key}}, {{key_sha256: '{GAMMA_SHA256.upper()}'}}]", "entries 0 and 1 are the same key"),
        ("[{key: a, key_sha256: '" + "0" * 64 + "'}]", "exactly one of key and key_sha256"),
        ("[{key_sha256: abc}]", "64 hex digits"),
        ("[{key: a, tenant: 'a b'}]", "should match pattern"),
        (f"[b, {{key: a, tenant: key-{hashlib.sha256(b'b').hexdigest()[:8]}}}]", "name their tenants"),
    ],
)
def test_bad_key_entries_are_config_errors(keys, message):
    with pytest.raises(ConfigError, match=message):
        load_config("local", [f"server.api_keys={keys}"])


# the stores ---------------------------------------------------------------------------------------


def owned(job: Job, tenant: str) -> Job:
    job.tenant = tenant
    return job


async def test_pending_pages_count_per_tenant_and_bound_the_quota(store):  # noqa: F811
    first, _ = await store.create(owned(make_job(3), "t1"), max_pending_pages=5)
    assert await store.pending_pages("t1") == 3 and await store.pending_pages("t2") == 0
    with pytest.raises(TooManyRequests, match=r"tenant t1 has 3 pages .* 3 more .* quota of 5") as refused:
        await store.create(owned(make_job(3), "t1"), max_pending_pages=5)
    assert refused.value.status == 429 and refused.value.headers["Retry-After"]
    assert await store.pending_pages("t1") == 3  # nothing stored
    await store.create(owned(make_job(3), "t2"), max_pending_pages=5)  # another tenant's quota
    await store.create(owned(make_job(2), "t1"), max_pending_pages=5)  # exactly at the quota
    assert await store.pending_pages("t1") == 5
    (claim,) = await store.claim("w", 1, LEASE)
    assert claim.job_id == first.id and await store.pending_pages("t1") == 5  # running pages count
    await store.complete(claim, ok())
    assert await store.pending_pages("t1") == 4
    await store.cancel(first.id)
    assert await store.pending_pages("t1") == 2
    cached, _ = await store.create(owned(make_job(2), "t1"), finished={0: ok(), 1: ok()}, max_pending_pages=2)
    assert cached.terminal and await store.pending_pages("t1") == 2  # from the cache: adds nothing, refused never
    await store.create(owned(make_job(2), "t3"), finished={1: ok()})
    assert await store.pending_pages("t3") == 1


async def test_idempotency_keys_are_per_tenant_in_the_store(store):  # noqa: F811
    mine, created = await store.create(owned(make_job(1, request_hash="a"), "t1"), "key")
    theirs, created_too = await store.create(owned(make_job(1, request_hash="b"), "t2"), "key")
    anonymous, created_also = await store.create(make_job(1, request_hash="c"), "key")
    assert created and created_too and created_also and len({mine.id, theirs.id, anonymous.id}) == 3
    again, replayed = await store.create(owned(make_job(1, request_hash="a"), "t1"), "key")
    assert again.id == mine.id and not replayed
    with pytest.raises(IdempotencyConflict) as conflict:
        await store.create(owned(make_job(1, request_hash="b"), "t1"), "key")
    assert mine.id in conflict.value.detail and theirs.id not in conflict.value.detail
    assert (await store.get(theirs.id)).tenant == "t2" and (await store.get(anonymous.id)).tenant == ANONYMOUS


#: The ``jobs`` table as the first release made it: no ``tenant`` column.
LEGACY_JOBS = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, status TEXT NOT NULL, priority INTEGER NOT NULL, created REAL NOT NULL,
    finished REAL NOT NULL DEFAULT 0, pages_total INTEGER NOT NULL, pages_ok INTEGER NOT NULL DEFAULT 0,
    pages_failed INTEGER NOT NULL DEFAULT 0, events INTEGER NOT NULL DEFAULT 0, spec TEXT NOT NULL,
    idempotency_key TEXT UNIQUE, webhook_due REAL
);
"""


async def test_sqlite_file_of_an_earlier_version_gains_tenants(tmp_path):
    path = tmp_path / "jobs.db"
    legacy = make_job(4, request_hash="old")
    spec = legacy.to_json()
    del spec["tenant"]
    with sqlite3.connect(path) as db:
        db.execute(LEGACY_JOBS)
        db.execute(
            "INSERT INTO jobs (id, status, priority, created, pages_total, spec, idempotency_key)"
            " VALUES (?, 'queued', 0, ?, 4, ?, 'old-key')",
            (legacy.id, legacy.created, json.dumps(spec)),
        )
    upgraded = SqliteStore(path)
    try:
        assert (await upgraded.get(legacy.id)).tenant == ANONYMOUS
        assert await upgraded.pending_pages(ANONYMOUS) == 4
        replay, created = await upgraded.create(make_job(1, request_hash="old"), "old-key")
        assert replay.id == legacy.id and not created  # the anonymous tenant keeps its keys
        fresh, created = await upgraded.create(owned(make_job(1, request_hash="old"), "t1"), "old-key")
        assert created and fresh.id != legacy.id
    finally:
        await upgraded.close()
    with sqlite3.connect(path) as db:
        assert "tenant" in {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
    SqliteStore(path)._conn().close()  # opening again: nothing left to add


# a gateway with several keys ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = Gateway(
        f"store.data_dir={tmp_path_factory.mktemp('tenants')}",
        "jobs.events_poll_s=0.1",
        f"server.api_keys={KEYS}",
        "server.rate_limit.failed_auth_per_s=1",  # a token back each second: the 429 holds while the test looks
        "server.rate_limit.failed_auth_burst=10",
        "server.protect_ops=true",
    ).wait_ready()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def client(gw):
    """``client(key)``: an httpx client of the gateway sending ``key`` (None: no key)."""
    opened: list[httpx.Client] = []

    def open_client(key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        opened.append(httpx.Client(base_url=gw.url, headers=headers, timeout=60))
        return opened[-1]

    yield open_client
    for http in opened:
        http.close()


def submit(http: httpx.Client, tiff: bytes, **headers: str) -> httpx.Response:
    return http.post("/v1/jobs", files={"file": ("doc.tif", tiff)}, headers=headers)


def accepted(response: httpx.Response) -> str:
    assert response.status_code == 202, response.text
    return response.json()["id"]


def unknown_job_problem(http: httpx.Client, job_id: str, method: str, path: str) -> dict:
    """The problem of ``method path`` for ``job_id``, its id put back as an unknown id's would read
    (and without the request's own id)."""
    body = assert_problem(http.request(method, path.format(job_id)), 404, "no job")
    return {**body, "detail": body["detail"].replace(job_id, "<id>"), "request_id": None}


def test_a_job_exists_only_for_its_tenant(client):
    alpha, beta, gamma = client("alpha-key"), client("beta-key"), client("gamma-key")
    job_id = accepted(submit(alpha, numbered_tiff(1, first=501)))
    assert wait_job(alpha, job_id)["status"] == "succeeded"
    unknown = uuid.uuid4().hex
    for method, path in [
        ("GET", "/v1/jobs/{}"),
        ("GET", "/v1/jobs/{}/result"),
        ("GET", "/v1/jobs/{}/events"),
        ("DELETE", "/v1/jobs/{}"),
    ]:
        assert unknown_job_problem(beta, job_id, method, path) == unknown_job_problem(beta, unknown, method, path)
    assert alpha.get(f"/v1/jobs/{job_id}/result", params={"format": "text"}).text.strip() == "Page\n501"
    assert read_events(alpha, job_id)[-1][0] == "done"
    shared = accepted(submit(beta, numbered_tiff(1, first=502)))  # beta and the hashed gamma share a tenant
    assert gamma.get(f"/v1/jobs/{shared}").status_code == 200
    assert alpha.get(f"/v1/jobs/{shared}").status_code == 404


def test_idempotency_keys_are_per_tenant(client):
    alpha, beta = client("alpha-key"), client("beta-key")
    first = accepted(submit(alpha, numbered_tiff(1, first=511), **{"Idempotency-Key": "order-1"}))
    other = submit(beta, numbered_tiff(1, first=512), **{"Idempotency-Key": "order-1"})
    assert accepted(other) != first and "idempotent-replayed" not in other.headers
    conflict = assert_problem(submit(alpha, numbered_tiff(1, first=512), **{"Idempotency-Key": "order-1"}), 409, first)
    assert other.json()["id"] not in conflict["detail"]
    replay = submit(beta, numbered_tiff(1, first=512), **{"Idempotency-Key": "order-1"})
    assert accepted(replay) == other.json()["id"] and replay.headers["idempotent-replayed"] == "true"


def test_a_key_given_as_its_sha256(client):
    assert client("gamma-key").get("/v1/models").status_code == 200
    assert_problem(client(GAMMA_SHA256).get("/v1/models"), 403, "not valid")


def test_rate_limit_answers_429_with_retry_after_and_ratelimit_fields(client):
    limited = client("limited-key")
    answers = [limited.get("/v1/models") for _ in range(4)]
    assert [a.status_code for a in answers[:3]] == [200, 200, 200]
    assert answers[0].headers["ratelimit-policy"] == '"requests";q=3;w=2'
    assert answers[0].headers["ratelimit"].startswith('"requests";r=2;t=')
    refused = assert_problem(answers[3], 429, r"too many requests of this API key: at most 3 at once and 2 per second")
    assert refused["type"].endswith("/rate-limited")
    assert metric(client("alpha-key"), "ocrserve_rejections_total", lane="none", reason="rate_limited") >= 1
    retry_after = int(answers[3].headers["retry-after"])
    assert retry_after >= 1 and answers[3].headers["ratelimit"].startswith('"requests";r=0;t=')
    assert answers[3].headers["ratelimit-policy"] == '"requests";q=3;w=2'
    time.sleep(retry_after)
    again = limited.get("/v1/models")
    assert again.status_code == 200 and again.headers["ratelimit"].startswith('"requests";r=')
    assert "ratelimit" not in client("alpha-key").get("/v1/models").headers  # no default limit here


def test_queued_pages_quota(client):
    quota = client("quota-key")
    assert_problem(submit(quota, numbered_tiff(21, first=600)), 429, r"quota of 20 .*max_queued_pages")
    big = accepted(submit(quota, numbered_tiff(20, first=700)))
    refused = submit(quota, numbered_tiff(10, first=800))  # the first job's 20 pages take seconds
    body = assert_problem(refused, 429, r"tenant quota has \d+ pages queued or running; this job's 10 more")
    assert body["type"].endswith("/tenant-quota") and int(refused.headers["retry-after"]) > 0
    assert accepted(submit(client("alpha-key"), numbered_tiff(1, first=900)))  # other tenants are not held up
    assert quota.delete(f"/v1/jobs/{big}").json()["status"] == "cancelled"
    later = accepted(submit(quota, numbered_tiff(10, first=800)))
    quota.delete(f"/v1/jobs/{later}")


def test_protect_ops_guards_metrics_and_docs_not_health(client):
    anonymous, alpha = client(None), client("alpha-key")
    for path in ("/metrics", "/docs", "/redoc", "/openapi.json"):
        assert_problem(anonymous.get(path), 401, "Bearer")
        assert alpha.get(path).status_code == 200, path
    assert anonymous.get("/healthz").status_code == 200 and anonymous.get("/readyz").status_code == 200
    operations = alpha.get("/openapi.json").json()["paths"]["/v1/jobs/{job_id}"]
    for operation in operations.values():
        assert {"401", "403", "404", "429"} <= set(operation["responses"])
    assert "RateLimit-Policy" in operations["get"]["responses"]["429"]["headers"]


def test_failed_authentications_are_limited_per_address(client):
    guesser, alpha = client("guess-0"), client("alpha-key")
    statuses = []
    for n in range(40):
        answer = guesser.get("/v1/models", headers={"Authorization": f"Bearer guess-{n}"})
        statuses.append(answer.status_code)
        if answer.status_code == 429:
            break
    assert statuses[-1] == 429 and set(statuses[:-1]) == {403} and len(statuses) > 5
    assert_problem(answer, 429, r"too many failed authentications from 127\.0\.0\.1")
    assert answer.headers["ratelimit-policy"] == '"failed-auth";q=10;w=10'
    assert alpha.get("/v1/models").status_code == 429  # a right guess now would not show
    time.sleep(int(answer.headers["retry-after"]))
    assert alpha.get("/v1/models").status_code == 200


def test_whom_the_lanes_share_the_engine_between():
    from starlette.requests import Request

    from ocrserve.api.auth import PRINCIPAL_ATTRIBUTE, client_of
    from ocrserve.api.tenants import Principal

    def request(headers: dict[str, str] | None = None, tenant: str | None = None) -> Request:
        scope = {
            "type": "http",
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
            "client": ("203.0.113.7", 5000),
        }
        req = Request(scope)
        if tenant:
            setattr(req.state, PRINCIPAL_ATTRIBUTE, Principal(tenant, "ab" * 32, None, 0))
        return req

    assert client_of(request(), "address") == "address:203.0.113.7"
    assert client_of(request({"X-Client-Id": "batch-7"}), "address") == "address:203.0.113.7"  # not trusted
    assert client_of(request({"X-Client-Id": "batch-7"}), "header") == "client:batch-7"
    assert client_of(request({"X-Client-Id": "x" * 500}), "header") == "client:" + "x" * 128
    assert client_of(request({"X-Client-Id": "batch-7"}, tenant="acme"), "header") == "tenant:acme"
    assert client_of(request(tenant="acme"), "off") == ""
