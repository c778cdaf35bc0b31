-- create.lua: store a new job and queue its pages, unless its Idempotency-Key names an earlier job
-- or its tenant's quota of pending pages is used up.
-- ARGV[2]: JSON {id, key (job_records.idempotency_scope of the Idempotency-Key, or ''), tenant, quota
--   (the tenant's most pages queued or running; 0 = none), spec (the job's JSON), rank (P:ready score),
--   webhook ('1' or '0'), pages ([[document, index], ...] by seq), finished ([[seq, outcome, event], ...]:
--   pages already done from the dedup cache)}.
-- Returns {1, id} when created, {0, id of the earlier job} when the key was taken, {-1, the tenant's
-- pending pages} when the job's pages would take them above the quota (nothing stored).

local a = cjson.decode(ARGV[2])
local pending = P .. ':pending:' .. a.tenant
if a.key ~= '' then
  local earlier = redis.call('GET', P .. ':idem:' .. a.key)
  if earlier then return {0, earlier} end
end
local adding = #a.pages - #a.finished
if a.quota > 0 and adding > 0 then
  local queued = tonumber(redis.call('GET', pending) or '0')
  if queued + adding > a.quota then return {-1, queued} end
end
if a.key ~= '' then redis.call('SET', P .. ':idem:' .. a.key, a.id) end
local jkey, pkey = P .. ':job:' .. a.id, P .. ':page:' .. a.id
redis.call('HSET', jkey, 'spec', a.spec, 'status', 'queued', 'rank', a.rank, 'pages_total', #a.pages,
           'pages_ok', 0, 'pages_failed', 0, 'finished', 0, 'webhook', a.webhook, 'idem', a.key,
           'tenant', a.tenant)
redis.call('INCRBY', pending, #a.pages)
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
