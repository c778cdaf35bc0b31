"""The job store contract, run against both implementations: SQLite (a real file) and Redis (a real
redis-server). Leases, re-claims, conditional completion, idempotency, retries, cancellation,
webhook claims, retention and the dedup-cache index."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ocrserve.config import JobsConfig, StoreConfig
from ocrserve.jobs.janitor import Janitor
from ocrserve.store import buckets, open_store, redis_store
from ocrserve.store.base import IdempotencyConflict
from ocrserve.store.files import DataDir
from ocrserve.store.job_records import Job, JobDocument, JobStatus, PageOutcome, PageState
from ocrserve.store.sqlite_store import SqliteStore
from tests.redis_server import redis_url  # noqa: F401  (fixture)

LEASE = 30.0


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request, tmp_path):
    if request.param == "sqlite":
        s = open_store(StoreConfig(data_dir=tmp_path))
        assert isinstance(s, SqliteStore) and s.path == tmp_path / "jobs.db"
    else:
        url = request.getfixturevalue("redis_url")
        s = open_store(StoreConfig(url=url, key_prefix=f"test-{secrets.token_hex(4)}", data_dir=tmp_path))
    yield s
    await s.close()


def make_job(pages: int = 3, *, priority: int = 0, webhook: str = "", request_hash: str = "h", created=None) -> Job:
    doc = JobDocument(
        name="d.tif",
        sha256="0" * 64,
        size=10,
        kind="image",
        page_count=pages,
        sizes=[[10, 10]] * pages,
        frames=list(range(pages)),
        indices=list(range(pages)),
    )
    return Job(
        id=uuid.uuid4().hex,
        status=JobStatus.QUEUED,
        priority=priority,
        created=created or time.time(),
        documents=[doc],
        model="m",
        webhook_url=webhook,
        request_hash=request_hash,
    )


def ok(path: str = "jobs/x/page.json") -> PageOutcome:
    return PageOutcome(PageState.DONE, path)


async def test_claim_order_priority_then_age_then_page(store):
    low, _ = await store.create(make_job(2, priority=0, created=time.time() - 10))
    high, _ = await store.create(make_job(2, priority=5))
    claimed = await store.claim("w", 3, LEASE)
    assert [(t.job_id, t.seq) for t in claimed] == [(high.id, 0), (high.id, 1), (low.id, 0)]
    assert all(t.attempts == 1 and t.token for t in claimed)
    assert (await store.get(high.id)).status == JobStatus.RUNNING
    assert (await store.get(low.id)).status == JobStatus.RUNNING
    assert await store.backlog() == 4
    (last,) = await store.claim("w", 5, LEASE)
    assert (last.job_id, last.seq) == (low.id, 1)
    assert await store.claim("w", 5, LEASE) == []


async def test_lapsed_lease_is_claimed_again_and_old_holder_learns_it(store):
    job = make_job(1)
    job.request_id = "req-1"
    job, _ = await store.create(job)
    assert (await store.get(job.id)).request_id == "req-1"  # kept with the job, for the worker's log lines
    (first,) = await store.claim("a", 1, 0.3)
    assert first.lapsed_from == ""
    assert await store.claim("b", 1, LEASE) == []  # leased
    assert await store.renew([first], 0.3) == []  # renewing keeps it
    await asyncio.sleep(0.45)
    (second,) = await store.claim("b", 1, LEASE)
    assert (second.seq, second.attempts) == (0, 2) and second.token != first.token
    assert second.lapsed_from == "a"  # whose lease lapsed: the worker's warning names it
    assert await store.renew([first, second], LEASE) == [first]  # a lost it
    assert not await store.retry_later(first, 0)  # a stale claim cannot requeue


async def test_completion_counts_once_and_ends_the_job(store):
    job, _ = await store.create(make_job(2))
    a0, a1 = await store.claim("a", 2, 0.2)
    await asyncio.sleep(0.3)
    (b0, b1) = await store.claim("b", 2, LEASE)  # both lapsed: at-least-once delivery
    assert (await store.complete(b0, ok("b0"))).counted
    second = await store.complete(a0, ok("a0"))  # the slow first claimant finishes too
    assert not second.counted and not second.ended
    last = await store.complete(a1, PageOutcome(PageState.FAILED, error={"status": 502, "detail": "x"}))
    assert last.counted and last.ended == JobStatus.PARTIAL
    assert not (await store.complete(b1, ok("b1"))).counted
    done = await store.get(job.id)
    assert (done.status, done.pages_ok, done.pages_failed, done.pages_done) == (JobStatus.PARTIAL, 1, 1, 2)
    assert done.finished > 0 and done.terminal
    pages = await store.pages(job.id)
    assert [(p.seq, p.state, p.result_path) for p in pages] == [(0, PageState.DONE, "b0"), (1, PageState.FAILED, "")]
    assert pages[1].error == {"status": 502, "detail": "x"}
    events = await store.events(job.id)
    assert [(e.id, e.data["page"], e.data["state"], e.data["pages_done"]) for e in events] == [
        (1, 0, "done", 1),
        (2, 1, "failed", 2),
    ]
    assert all(e.data["pages_total"] == 2 for e in events)
    assert [e.id for e in await store.events(job.id, after=1)] == [2]
    assert await store.backlog() == 0


async def test_open_jobs_by_status(store):
    assert await store.open_jobs() == {"queued": 0, "running": 0}
    first, _ = await store.create(make_job(2, priority=5))
    await store.create(make_job(1))
    assert await store.open_jobs() == {"queued": 2, "running": 0}
    (claim,) = await store.claim("w", 1, LEASE)
    assert claim.job_id == first.id and await store.open_jobs() == {"queued": 1, "running": 1}
    await store.cancel(first.id)
    assert await store.open_jobs() == {"queued": 1, "running": 0}


async def test_idempotency_key(store):
    first, created = await store.create(make_job(1, request_hash="same"), "key-1")
    assert created
    again, created = await store.create(make_job(1, request_hash="same"), "key-1")
    assert not created and again.id == first.id
    with pytest.raises(IdempotencyConflict, match=first.id):
        await store.create(make_job(1, request_hash="other"), "key-1")
    other, created = await store.create(make_job(1, request_hash="other"), "key-2")
    assert created and other.id != first.id


async def test_retry_later_waits_out_the_backoff_and_release_uncounts(store):
    await store.create(make_job(1))
    (task,) = await store.claim("w", 1, LEASE)
    assert await store.retry_later(task, 0.4)
    assert await store.claim("w", 1, LEASE) == []
    await asyncio.sleep(0.5)
    (again,) = await store.claim("w", 1, LEASE)
    assert again.attempts == 2
    assert await store.release(again)
    (third,) = await store.claim("w", 1, LEASE)
    assert third.attempts == 2  # a released claim was not an attempt


async def test_cancel_keeps_queued_pages_from_being_claimed(store):
    job, _ = await store.create(make_job(3, webhook="http://hook"))
    (running,) = await store.claim("w", 1, LEASE)
    assert (await store.complete(running, ok())).counted
    (held,) = await store.claim("w", 1, LEASE)
    cancelled = await store.cancel(job.id)
    assert cancelled.status == JobStatus.CANCELLED and cancelled.pages_done == 1
    assert await store.claim("w", 5, LEASE) == []
    assert await store.renew([held], LEASE) == [held]
    assert not (await store.complete(held, ok())).counted
    assert [p.state for p in await store.pages(job.id)] == [PageState.DONE, PageState.CANCELLED, PageState.CANCELLED]
    assert (await store.cancel(job.id)).status == JobStatus.CANCELLED
    assert await store.cancel("no-such-job") is None
    hook = await store.claim_webhook(LEASE)
    assert hook.id == job.id
    assert len(await store.events(job.id)) == 1


async def test_pages_known_at_creation_finish_at_once(store):
    job, _ = await store.create(make_job(2), finished={0: ok("c0"), 1: ok("c1")})
    assert job.status == JobStatus.SUCCEEDED and job.pages_ok == 2
    assert await store.claim("w", 5, LEASE) == []
    assert [e.data["page"] for e in await store.events(job.id)] == [0, 1]
    half, _ = await store.create(make_job(2), finished={1: ok("c1")})
    assert half.pages_done == 1 and not half.terminal
    (task,) = await store.claim("w", 5, LEASE)
    assert task.seq == 0


async def test_webhook_claims_are_leased_until_done(store):
    job, _ = await store.create(make_job(1, webhook="http://hook"))
    plain, _ = await store.create(make_job(1))
    for _ in (job, plain):
        (task,) = await store.claim("w", 1, LEASE)
        await store.complete(task, ok())
    claimed = await store.claim_webhook(0.3)
    assert claimed.id == job.id and claimed.status == JobStatus.SUCCEEDED
    assert await store.claim_webhook(0.3) is None  # leased, and the other job has no webhook
    await asyncio.sleep(0.4)
    assert (await store.claim_webhook(LEASE)).id == job.id  # the sender died: someone else sends it
    await store.webhook_done(job.id)
    await asyncio.sleep(0.1)
    assert await store.claim_webhook(0.1) is None


async def test_retention_janitor_deletes_jobs_and_files(store, tmp_path):
    data = DataDir(tmp_path / "data")
    job, _ = await store.create(make_job(1, request_hash="r"), "key-r")
    running, _ = await store.create(make_job(1))
    data.job_dir(job.id).mkdir(parents=True)
    (task,) = [t for t in await store.claim("w", 2, LEASE) if t.job_id == job.id]
    path = data.write_page(job.id, 0, task.token, {"text": "x"})
    await store.complete(task, ok(path))
    janitor = Janitor(store, data, JobsConfig(retention_s=0.2))
    assert await janitor.sweep() == 0
    await asyncio.sleep(0.3)
    assert await janitor.sweep() == 1
    assert await store.get(job.id) is None and not data.job_dir(job.id).exists()
    assert await store.events(job.id) == [] and await store.pages(job.id) == []
    assert await store.get(running.id) is not None  # still running: kept
    _, created = await store.create(make_job(1, request_hash="new"), "key-r")
    assert created  # the key went with its job


async def test_cache_index_is_lru(store):
    assert not await store.cache_touch("a")
    assert await store.cache_add("a", 2) == []
    await asyncio.sleep(0.01)
    assert await store.cache_add("b", 2) == []
    await asyncio.sleep(0.01)
    assert await store.cache_touch("a")  # a is now the most recent
    await asyncio.sleep(0.01)
    assert await store.cache_add("c", 2) == ["b"]
    assert await store.cache_touch("a") and await store.cache_touch("c") and not await store.cache_touch("b")


def test_store_url_forms(tmp_path):
    assert StoreConfig(data_dir="~/jobs").data_dir == Path.home() / "jobs"
    assert open_store(StoreConfig(url="sqlite:///rel/jobs.db", data_dir=tmp_path)).path.as_posix() == "rel/jobs.db"
    assert open_store(StoreConfig(url="sqlite:////abs/jobs.db", data_dir=tmp_path)).path.as_posix() == "/abs/jobs.db"
    with pytest.raises(ValueError, match="store.url"):
        open_store(StoreConfig(url="postgres://x", data_dir=tmp_path))


def test_statuses_are_the_plain_strings_stored_and_dumped():
    assert [str(s) for s in JobStatus] == ["queued", "running", "succeeded", "failed", "partial", "cancelled"]
    assert [f"{s}" for s in PageState] == ["queued", "running", "done", "failed", "cancelled"]
    assert f"{JobStatus.PARTIAL:>9}|" == "  partial|" and JobStatus.FAILED == "failed"
    assert json.dumps({"state": PageState.DONE}) == '{"state": "done"}'
    job = make_job(1)
    assert json.loads(json.dumps(job.to_json()))["status"] == "queued"
    old = {**json.loads(json.dumps(job.to_json())), "status": "succeeded"}  # as an earlier release stored it
    loaded = Job.from_json(old)
    assert loaded.status is JobStatus.SUCCEEDED and loaded.terminal


def test_every_lua_file_is_a_registered_script():
    folder = Path(redis_store.__file__).parent / "lua"
    assert {p.stem for p in folder.glob("*.lua")} == {redis_store.COMMON, *redis_store.SCRIPTS, buckets.SCRIPT}
    common = (folder / f"{redis_store.COMMON}.lua").read_text()
    store = redis_store.RedisStore("redis://127.0.0.1:1/0")  # registering scripts does not connect
    assert set(store._scripts) == set(redis_store.SCRIPTS)
    for name in redis_store.SCRIPTS:
        source = redis_store.lua_source(name)
        assert source.startswith(common) and source.endswith((folder / f"{name}.lua").read_text())
        assert store._scripts[name].script == source


@pytest.mark.redis
async def test_every_lua_script_compiles_on_the_server(redis_url):  # noqa: F811
    client = aioredis.Redis.from_url(redis_url)
    try:
        for name in (*redis_store.SCRIPTS, buckets.SCRIPT):
            assert await client.script_load(redis_store.lua_source(name))  # raises on a syntax error
    finally:
        await client.aclose()
