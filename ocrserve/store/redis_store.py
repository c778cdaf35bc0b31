"""The shared job store: Redis (redis-py, asyncio), for several gateway replicas sharing the work.

Every state change is one Lua script, so it is atomic, and leases use the Redis server's clock
(``TIME``), so replicas with skewed clocks still agree. Keys, under ``store.key_prefix`` (``P``):

| key | type | what |
|---|---|---|
| ``P:job:{id}`` | hash | ``spec`` (the job as JSON), ``status``, counters, ``rank``, ``webhook``, ``idem`` |
| ``P:page:{id}`` | hash | ``seq`` -> page JSON (document, index, state, attempts, owner, token, result_path, error) |
| ``P:events:{id}`` | list | page events; event ``id`` = list position + 1 |
| ``P:ready`` | zset | pages to claim, ``{id}:{seq:06d}`` scored by the job's rank (priority, then age) |
| ``P:delayed`` | zset | pages waiting out a retry backoff, scored by when they may run |
| ``P:leases`` | zset | claimed pages, scored by lease end; lapsed ones return to ``P:ready`` |
| ``P:idem:{key}`` | string | job id of an ``Idempotency-Key`` |
| ``P:finished`` | zset | ended jobs by end time (retention) |
| ``P:webhooks`` | zset | ended jobs whose webhook is owed, by when it may next be claimed |
| ``P:cache`` | zset | dedup-cache keys by last use (LRU) |
"""

from __future__ import annotations

import json
import secrets
import time

import redis.asyncio as aioredis

from ocrserve.store.records import Completion, Event, Job, PageOutcome, PageRecord, PageTask, page_event
from ocrserve.store.base import IdempotencyConflict, JobStore

#: Seconds of ``created`` are scaled by this into a job's rank (ms resolution).
RANK_SCALE = 1000
#: Rank distance between adjacent priorities: larger than any ``created`` in ms (until year 2286).
PRIORITY_STEP = 10**13

# Shared by the scripts below: the Redis server's clock, and how a page is finished.
_COMMON = r"""
local P = ARGV[1]
local T = redis.call('TIME')
local now = tonumber(T[1]) + tonumber(T[2]) / 1e6
local TERMINAL = {succeeded = true, failed = true, partial = true, cancelled = true}
local OPEN = {queued = true, running = true}

local function unclaim(member)
  redis.call('ZREM', P .. ':ready', member)
  redis.call('ZREM', P .. ':delayed', member)
  redis.call('ZREM', P .. ':leases', member)
end

local function job_ended(job, status)
  local jkey = P .. ':job:' .. job
  redis.call('HSET', jkey, 'status', status, 'finished', tostring(now))
  redis.call('ZADD', P .. ':finished', now, job)
  if redis.call('HGET', jkey, 'webhook') == '1' then redis.call('ZADD', P .. ':webhooks', now, job) end
end

-- Finish page `seq` of `job` unless it (or its job) already has; returns {counted, ended status}.
local function finish(job, seq, member, outcome, event)
  local jkey, pkey = P .. ':job:' .. job, P .. ':page:' .. job
  local status = redis.call('HGET', jkey, 'status')
  local raw = redis.call('HGET', pkey, seq)
  if not status or not raw or TERMINAL[status] then return {0, ''} end
  local page = cjson.decode(raw)
  if not OPEN[page.state] then return {0, ''} end
  page.state, page.result_path, page.error, page.owner, page.token = outcome.state, outcome.result_path, outcome.error, nil, nil
  redis.call('HSET', pkey, seq, cjson.encode(page))
  unclaim(member)
  redis.call('HINCRBY', jkey, outcome.state == 'failed' and 'pages_failed' or 'pages_ok', 1)
  local ok = tonumber(redis.call('HGET', jkey, 'pages_ok'))
  local failed = tonumber(redis.call('HGET', jkey, 'pages_failed'))
  local total = tonumber(redis.call('HGET', jkey, 'pages_total'))
  event.pages_done, event.pages_total = ok + failed, total
  redis.call('RPUSH', P .. ':events:' .. job, cjson.encode(event))
  if ok + failed < total then
    redis.call('HSET', jkey, 'status', 'running')
    return {1, ''}
  end
  -- the rule of ocrserve.store.records.final_status
  local ended = (failed == 0 and 'succeeded') or (ok == 0 and 'failed') or 'partial'
  job_ended(job, ended)
  return {1, ended}
end
"""

_CREATE = _COMMON + r"""
local a = cjson.decode(ARGV[2])
if a.key ~= '' then
  local earlier = redis.call('GET', P .. ':idem:' .. a.key)
  if earlier then return {0, earlier} end
  redis.call('SET', P .. ':idem:' .. a.key, a.id)
end
local jkey, pkey = P .. ':job:' .. a.id, P .. ':page:' .. a.id
redis.call('HSET', jkey, 'spec', a.spec, 'status', 'queued', 'rank', a.rank, 'pages_total', #a.pages,
           'pages_ok', 0, 'pages_failed', 0, 'finished', 0, 'webhook', a.webhook, 'idem', a.key)
for i, ref in ipairs(a.pages) do
  redis.call('HSET', pkey, i - 1, cjson.encode({document = ref[1], index = ref[2], state = 'queued', attempts = 0}))
end
for _, f in ipairs(a.finished) do
  finish(a.id, tostring(f[1]), string.format('%s:%06d', a.id, f[1]), f[2], f[3])
end
for i = 1, #a.pages do
  if cjson.decode(redis.call('HGET', pkey, i - 1)).state == 'queued' then
    redis.call('ZADD', P .. ':ready', a.rank, string.format('%s:%06d', a.id, i - 1))
  end
end
return {1, a.id}
"""

_CLAIM = _COMMON + r"""
local owner, lease, limit = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local function requeue_due(zset)
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', zset, '-inf', now)) do
    redis.call('ZREM', zset, m)
    local rank = redis.call('HGET', P .. ':job:' .. string.match(m, '^(.-):'), 'rank')
    if rank then redis.call('ZADD', P .. ':ready', rank, m) end
  end
end
requeue_due(P .. ':leases')   -- claims whose holder stopped renewing
requeue_due(P .. ':delayed')  -- retries whose backoff is over
local out = {}
while #out < limit do
  local popped = redis.call('ZPOPMIN', P .. ':ready')
  if #popped == 0 then break end
  local m = popped[1]
  local job, seq = string.match(m, '^(.-):(%d+)$')
  seq = tostring(tonumber(seq))
  local jkey, pkey = P .. ':job:' .. job, P .. ':page:' .. job
  local status = redis.call('HGET', jkey, 'status')
  local raw = redis.call('HGET', pkey, seq)
  if status and raw and OPEN[status] then
    local page = cjson.decode(raw)
    if OPEN[page.state] then
      page.state, page.attempts, page.owner, page.token = 'running', page.attempts + 1, owner, ARGV[5 + #out]
      redis.call('HSET', pkey, seq, cjson.encode(page))
      redis.call('ZADD', P .. ':leases', now + lease, m)
      if status == 'queued' then redis.call('HSET', jkey, 'status', 'running') end
      table.insert(out, {job, tonumber(seq), page.document, page.index, page.attempts, page.token})
    end
  end
end
return out
"""

_RENEW = _COMMON + r"""
local lease = tonumber(ARGV[2])
local lost = {}
for i = 3, #ARGV, 3 do
  local job, seq, token = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local raw = redis.call('HGET', P .. ':page:' .. job, seq)
  local page = raw and cjson.decode(raw)
  local m = string.format('%s:%06d', job, tonumber(seq))
  if page and page.state == 'running' and page.token == token then
    redis.call('ZREM', P .. ':ready', m)  -- lapsed and requeued, but its holder is alive after all
    redis.call('ZADD', P .. ':leases', now + lease, m)
  else
    table.insert(lost, (i - 3) / 3)
  end
end
return lost
"""

_COMPLETE = _COMMON + r"""
return finish(ARGV[2], ARGV[3], string.format('%s:%06d', ARGV[2], tonumber(ARGV[3])), cjson.decode(ARGV[4]),
              cjson.decode(ARGV[5]))
"""

_REQUEUE = _COMMON + r"""
local job, seq, token, delay, uncount = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local pkey = P .. ':page:' .. job
local raw = redis.call('HGET', pkey, seq)
local page = raw and cjson.decode(raw)
if not page or page.state ~= 'running' or page.token ~= token then return 0 end
page.state, page.attempts, page.owner, page.token = 'queued', page.attempts - uncount, nil, nil
redis.call('HSET', pkey, seq, cjson.encode(page))
local m = string.format('%s:%06d', job, tonumber(seq))
unclaim(m)
if delay > 0 then
  redis.call('ZADD', P .. ':delayed', now + delay, m)
else
  redis.call('ZADD', P .. ':ready', redis.call('HGET', P .. ':job:' .. job, 'rank'), m)
end
return 1
"""

_CANCEL = _COMMON + r"""
local job = ARGV[2]
local jkey, pkey = P .. ':job:' .. job, P .. ':page:' .. job
local status = redis.call('HGET', jkey, 'status')
if not status then return 0 end
if TERMINAL[status] then return 1 end
local pages = redis.call('HGETALL', pkey)
for i = 1, #pages, 2 do
  local page = cjson.decode(pages[i + 1])
  if OPEN[page.state] then
    page.state, page.owner, page.token = 'cancelled', nil, nil
    redis.call('HSET', pkey, pages[i], cjson.encode(page))
    unclaim(string.format('%s:%06d', job, tonumber(pages[i])))
  end
end
job_ended(job, 'cancelled')
return 1
"""

_CLAIM_WEBHOOK = _COMMON + r"""
local due = redis.call('ZRANGEBYSCORE', P .. ':webhooks', '-inf', now, 'LIMIT', 0, 1)
if #due == 0 then return false end
redis.call('ZADD', P .. ':webhooks', now + tonumber(ARGV[2]), due[1])
return due[1]
"""

_DELETE = _COMMON + r"""
local job = ARGV[2]
local idem = redis.call('HGET', P .. ':job:' .. job, 'idem')
if idem and idem ~= '' then redis.call('DEL', P .. ':idem:' .. idem) end
redis.call('DEL', P .. ':job:' .. job, P .. ':page:' .. job, P .. ':events:' .. job)
redis.call('ZREM', P .. ':finished', job)
redis.call('ZREM', P .. ':webhooks', job)
return 1
"""

_CACHE_ADD = _COMMON + r"""
local key, max = ARGV[2], tonumber(ARGV[3])
redis.call('ZADD', P .. ':cache', now, key)
local excess = redis.call('ZCARD', P .. ':cache') - max
local evicted = {}
if excess > 0 then
  local popped = redis.call('ZPOPMIN', P .. ':cache', excess)
  for i = 1, #popped, 2 do table.insert(evicted, popped[i]) end
end
return evicted
"""


def member(job_id: str, seq: int) -> str:
    """A page's member in the ready, delayed and lease sets."""
    return f"{job_id}:{seq:06d}"


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
        self._redis = aioredis.Redis.from_url(url, decode_responses=True)
        scripts = {"create": _CREATE, "claim": _CLAIM, "renew": _RENEW, "complete": _COMPLETE,
                   "requeue": _REQUEUE, "cancel": _CANCEL, "claim_webhook": _CLAIM_WEBHOOK, "delete": _DELETE,
                   "cache_add": _CACHE_ADD}
        self._scripts = {name: self._redis.register_script(source) for name, source in scripts.items()}

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    async def _run(self, script: str, *args):
        return await self._scripts[script](args=[self.prefix, *args])

    async def create(self, job, idempotency_key="", finished=None):
        refs = job.page_refs()
        finished = finished or {}
        payload = {
            "id": job.id, "key": idempotency_key, "spec": json.dumps(job.to_json()), "rank": rank(job.priority, job.created),
            "webhook": "1" if job.webhook_url else "0", "pages": [list(r) for r in refs],
            "finished": [[seq, _outcome(o), page_event(seq, *refs[seq], o)] for seq, o in sorted(finished.items())],
        }
        created, job_id = await self._run("create", json.dumps(payload))
        if created:
            return await self.get(job_id), True
        earlier = await self.get(job_id)
        if earlier is None or earlier.request_hash != job.request_hash:
            raise IdempotencyConflict(
                f"Idempotency-Key {idempotency_key!r} was used for job {job_id} with a different request")
        return earlier, False

    async def get(self, job_id):
        fields = await self._redis.hgetall(self._key("job", job_id))
        if not fields:
            return None
        job = Job.from_json(json.loads(fields["spec"]))
        job.status, job.pages_ok, job.pages_failed, job.finished = (
            fields["status"], int(fields["pages_ok"]), int(fields["pages_failed"]), float(fields["finished"]))
        return job

    async def pages(self, job_id):
        raw = await self._redis.hgetall(self._key("page", job_id))
        records = []
        for seq, text in sorted(raw.items(), key=lambda kv: int(kv[0])):
            p = json.loads(text)
            records.append(PageRecord(int(seq), p["document"], p["index"], p["state"], p["attempts"],
                                      p.get("result_path") or "", p.get("error")))
        return records

    async def claim(self, owner, limit, lease_s):
        tokens = [secrets.token_hex(8) for _ in range(limit)]
        rows = await self._run("claim", owner, lease_s, limit, *tokens)
        return [PageTask(job, int(seq), int(doc), int(index), int(attempts), token)
                for job, seq, doc, index, attempts, token in rows]

    async def renew(self, tasks, lease_s):
        if not tasks:
            return []
        args = [x for t in tasks for x in (t.job_id, t.seq, t.token)]
        lost = await self._run("renew", lease_s, *args)
        return [tasks[int(i)] for i in lost]

    async def complete(self, task, outcome):
        event = page_event(task.seq, task.document, task.index, outcome)
        counted, ended = await self._run("complete", task.job_id, task.seq, json.dumps(_outcome(outcome)),
                                         json.dumps(event))
        return Completion(bool(counted), ended)

    async def retry_later(self, task, delay_s):
        return bool(await self._run("requeue", task.job_id, task.seq, task.token, max(delay_s, 1e-3), 0))

    async def release(self, task):
        return bool(await self._run("requeue", task.job_id, task.seq, task.token, 0, 1))

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

    async def close(self):
        await self._redis.aclose()


def _outcome(outcome: PageOutcome) -> dict:
    return {"state": outcome.state, "result_path": outcome.result_path, "error": outcome.error}
