"""The shared job store: Redis (redis-py, asyncio), for several gateway replicas sharing the work.

Every state change is one Lua script (``lua/<name>.lua`` beside this module), so it is atomic,
and leases use the Redis server's clock (``TIME``), so replicas with skewed clocks still agree.
Keys, under ``store.key_prefix`` (``P``):

| key | type | what |
|---|---|---|
| ``P:job:{id}`` | hash | ``spec`` (the job's JSON), ``status``, counters, ``rank``, ``webhook``, ``idem``, ``tenant`` |
| ``P:page:{id}`` | hash | ``seq`` -> page JSON (document, index, state, attempts, owner, token, result_path, error) |
| ``P:events:{id}`` | list | page events; event ``id`` = list position + 1 |
| ``P:ready`` | zset | pages to claim, ``{id}:{seq:06d}`` scored by the job's rank (priority, then age) |
| ``P:delayed`` | zset | pages waiting out a retry backoff, scored by when they may run |
| ``P:leases`` | zset | claimed pages, scored by lease end; lapsed ones return to ``P:ready`` |
| ``P:idem:{scope}`` | string | job id of an ``Idempotency-Key`` (tenant-scoped: ``job_records.idempotency_scope``) |
| ``P:pending:{tenant}`` | string | the tenant's pages queued or running (absent: none) |
| ``P:finished`` | zset | ended jobs by end time (retention) |
| ``P:webhooks`` | zset | ended jobs whose webhook is owed, by when it may next be claimed |
| ``P:cache`` | zset | dedup-cache keys by last use (LRU) |
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from importlib import resources

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from ocrserve.store.base import IdempotencyConflict, JobStore, quota_exceeded
from ocrserve.store.job_records import (
    Claim,
    Completion,
    Event,
    Job,
    JobStatus,
    PageOutcome,
    PageRecord,
    PageState,
    idempotency_scope,
    page_event,
)

#: Seconds of ``created`` are scaled by this into a job's rank (ms resolution).
RANK_SCALE = 1000
#: Rank distance between adjacent priorities: larger than any ``created`` in ms (until year 2286).
PRIORITY_STEP = 10**13

#: The Lua scripts, by name: ``lua/<name>.lua`` (package data), each run after ``lua/common.lua``.
SCRIPTS = ("create", "claim", "renew", "complete", "requeue", "cancel", "claim_webhook", "delete", "cache_add")
#: Shared by the scripts: the Redis server's clock, and how a page is finished.
COMMON = "common"


@functools.cache
def lua_source(name: str) -> str:
    """The source Redis runs for script ``name``: ``lua/common.lua``, then ``lua/<name>.lua``.

    Raises:
        FileNotFoundError: no such script.
    """
    folder = resources.files("ocrserve.store") / "lua"
    return "\n".join((folder / f"{part}.lua").read_text(encoding="utf-8") for part in (COMMON, name))


def rank(priority: int, created: float) -> str:
    """A job's score in ``P:ready``: higher priority first, then older first."""
    return str(-priority * PRIORITY_STEP + int(created * RANK_SCALE))


class RedisStore(JobStore):
    """:class:`~ocrserve.store.base.JobStore` in Redis.

    Args:
        url: ``redis://host:port/db`` (or ``rediss://``, ``unix://``).
        prefix: namespace of every key.
    """

    def __init__(self, url: str, prefix: str = "ocrserve"):
        self.prefix = prefix
        # A restarted server leaves dead connections in the pool: each call retries on a fresh one.
        self._redis = aioredis.Redis.from_url(
            url, decode_responses=True, retry=Retry(ExponentialBackoff(), 3), retry_on_error=[RedisConnectionError]
        )
        self._scripts = {name: self._redis.register_script(lua_source(name)) for name in SCRIPTS}

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    async def _run(self, script: str, *args):
        return await self._scripts[script](args=[self.prefix, *args])

    async def create(self, job, idempotency_key="", finished=None, max_pending_pages=0):
        refs = job.page_refs()
        finished = finished or {}
        payload = {
            "id": job.id,
            "key": idempotency_scope(job.tenant, idempotency_key),
            "tenant": job.tenant,
            "quota": max_pending_pages,
            "spec": json.dumps(job.to_json()),
            "rank": rank(job.priority, job.created),
            "webhook": "1" if job.webhook_url else "0",
            "pages": [list(r) for r in refs],
            "finished": [[seq, _outcome(o), page_event(seq, *refs[seq], o)] for seq, o in sorted(finished.items())],
        }
        created, job_id = await self._run("create", json.dumps(payload))
        if created == -1:  # then the second value is the tenant's pending pages
            raise quota_exceeded(job.tenant, int(job_id), len(refs) - len(finished), max_pending_pages)
        if created:
            return await self.get(job_id), True
        earlier = await self.get(job_id)
        if earlier is None or earlier.request_hash != job.request_hash:
            raise IdempotencyConflict(
                f"Idempotency-Key {idempotency_key!r} was used for job {job_id} with a different request"
            )
        return earlier, False

    async def pending_pages(self, tenant):
        return int(await self._redis.get(self._key("pending", tenant)) or 0)

    async def get(self, job_id):
        fields = await self._redis.hgetall(self._key("job", job_id))
        if not fields:
            return None
        job = Job.from_json(json.loads(fields["spec"]))
        job.status, job.pages_ok, job.pages_failed, job.finished = (
            JobStatus(fields["status"]),
            int(fields["pages_ok"]),
            int(fields["pages_failed"]),
            float(fields["finished"]),
        )
        return job

    async def pages(self, job_id):
        raw = await self._redis.hgetall(self._key("page", job_id))
        records = []
        for seq, text in sorted(raw.items(), key=lambda kv: int(kv[0])):
            p = json.loads(text)
            records.append(
                PageRecord(
                    int(seq),
                    p["document"],
                    p["index"],
                    PageState(p["state"]),
                    p["attempts"],
                    p.get("result_path") or "",
                    p.get("error"),
                )
            )
        return records

    async def claim(self, owner, limit, lease_s):
        tokens = [secrets.token_hex(8) for _ in range(limit)]
        rows = await self._run("claim", owner, lease_s, limit, *tokens)
        return [
            Claim(job, int(seq), int(doc), int(index), int(attempts), token, lapsed_from)
            for job, seq, doc, index, attempts, token, lapsed_from in rows
        ]

    async def renew(self, claims, lease_s):
        if not claims:
            return []
        args = [x for t in claims for x in (t.job_id, t.seq, t.token)]
        lost = await self._run("renew", lease_s, *args)
        return [claims[int(i)] for i in lost]

    async def complete(self, claim, outcome):
        event = page_event(claim.seq, claim.document, claim.index, outcome)
        counted, ended = await self._run(
            "complete", claim.job_id, claim.seq, json.dumps(_outcome(outcome)), json.dumps(event)
        )
        return Completion(bool(counted), JobStatus(ended) if ended else "")

    async def retry_later(self, claim, delay_s):
        return bool(await self._run("requeue", claim.job_id, claim.seq, claim.token, max(delay_s, 1e-3), 0))

    async def release(self, claim):
        return bool(await self._run("requeue", claim.job_id, claim.seq, claim.token, 0, 1))

    async def cancel(self, job_id):
        if not await self._run("cancel", job_id):
            return None
        return await self.get(job_id)

    async def events(self, job_id, after=0):
        raw = await self._redis.lrange(self._key("events", job_id), after, -1)
        return [Event(after + n, json.loads(text)) for n, text in enumerate(raw, start=1)]

    async def claim_webhook(self, lease_s):
        job_id = await self._run("claim_webhook", lease_s)
        return await self.get(job_id) if job_id else None

    async def webhook_done(self, job_id):
        await self._redis.zrem(self._key("webhooks"), job_id)

    async def expired(self, before, limit=100):
        return await self._redis.zrangebyscore(self._key("finished"), "-inf", f"({before}", start=0, num=limit)

    async def delete(self, job_id):
        await self._run("delete", job_id)

    async def cache_touch(self, key):
        return bool(await self._redis.zadd(self._key("cache"), {key: time.time()}, xx=True, ch=True))

    async def cache_add(self, key, max_entries):
        return list(await self._run("cache_add", key, max_entries))

    async def backlog(self):
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in ("ready", "delayed", "leases"):
                pipe.zcard(self._key(name))
            return sum(await pipe.execute())

    async def open_jobs(self):
        # no index of open jobs: they are those with pages in the queues (members are "{id}:{seq}")
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in ("ready", "delayed", "leases"):
                pipe.zrange(self._key(name), 0, -1)
            jobs = sorted({member.rpartition(":")[0] for queue in await pipe.execute() for member in queue})
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in jobs:
                pipe.hget(self._key("job", job_id), "status")
            statuses = await pipe.execute() if jobs else []
        counts = {JobStatus.QUEUED: 0, JobStatus.RUNNING: 0}
        for status in statuses:
            if status in counts:
                counts[status] += 1
        return counts

    async def close(self):
        await self._redis.aclose()


def _outcome(outcome: PageOutcome) -> dict:
    return {"state": outcome.state, "result_path": outcome.result_path, "error": outcome.error}
