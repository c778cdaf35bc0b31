-- delete.lua: remove an ended job: its hash, pages, events, Idempotency-Key, retention and
-- webhook entries.
-- ARGV[2]: job.
-- Returns 1.

local job = ARGV[2]
local idem = redis.call('HGET', P .. ':job:' .. job, 'idem')
if idem and idem ~= '' then redis.call('DEL', P .. ':idem:' .. idem) end
redis.call('DEL', P .. ':job:' .. job, P .. ':page:' .. job, P .. ':events:' .. job)
redis.call('ZREM', P .. ':finished', job)
redis.call('ZREM', P .. ':webhooks', job)
return 1
