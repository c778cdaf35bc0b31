-- cache_add.lua: mark a dedup-cache key used now and evict the least recently used keys beyond `max`.
-- ARGV[2]: key; ARGV[3]: max entries.
-- Returns the evicted keys (their files are the caller's to delete).

local key, max = ARGV[2], tonumber(ARGV[3])
redis.call('ZADD', P .. ':cache', now, key)
local excess = redis.call('ZCARD', P .. ':cache') - max
local evicted = {}
if excess > 0 then
  local popped = redis.call('ZPOPMIN', P .. ':cache', excess)
  for i = 1, #popped, 2 do table.insert(evicted, popped[i]) end
end
return evicted
