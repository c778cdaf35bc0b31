-- requeue.lua: give a claimed page back: to P:delayed for `delay` seconds (a retry), or straight to
-- P:ready (a release, which does not count as an attempt).
-- ARGV[2]: job; ARGV[3]: seq; ARGV[4]: the claim's token; ARGV[5]: delay, seconds (0: ready now);
-- ARGV[6]: 1 to uncount the claim's attempt, else 0.
-- Returns 1, or 0 when the page is no longer running under that token.

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
