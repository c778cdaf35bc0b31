-- common.lua: the prelude of every other script here (RedisStore sends it in front of each).
-- No KEYS: every key is built from the prefix, so the scripts touch keys they do not declare
-- (one Redis server, not a cluster).
-- ARGV[1]: the key prefix P (``store.key_prefix``); each script's own arguments follow from ARGV[2].
-- Defines: P; now (the server's clock, Unix seconds, from TIME); TERMINAL (job statuses that never
-- change) and OPEN (queued, running); unclaim(member) (out of P:ready, P:delayed and P:leases);
-- job_ended(job, status) (status, end time, P:finished, P:webhooks if it has one); unpend(job, n)
-- (n of the job's pages no longer queued or running: off its tenant's P:pending:{tenant} count); and
-- finish(job, seq, member, outcome, event), which finishes a page once and ends its job after the
-- last page, returning {1 if counted else 0, the job's final status or ''}.

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

-- Jobs stored before tenants existed have no tenant field and were never counted.
local function unpend(job, n)
  local tenant = redis.call('HGET', P .. ':job:' .. job, 'tenant')
  if tenant and n > 0 then
    local key = P .. ':pending:' .. tenant
    if redis.call('DECRBY', key, n) <= 0 then redis.call('DEL', key) end
  end
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
  unpend(job, 1)
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
  -- the rule of ocrserve.store.job_records.final_status
  local ended = (failed == 0 and 'succeeded') or (ok == 0 and 'failed') or 'partial'
  job_ended(job, ended)
  return {1, ended}
end
