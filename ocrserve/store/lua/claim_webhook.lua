-- claim_webhook.lua: claim the longest-due webhook of an ended job, leasing it (pushing its due time
-- `lease` seconds ahead, so another gateway retries it if this one dies).
-- ARGV[2]: lease, seconds.
-- Returns the job id, or false when none is due.

local due = redis.call('ZRANGEBYSCORE', P .. ':webhooks', '-inf', now, 'LIMIT', 0, 1)
if #due == 0 then return false end
redis.call('ZADD', P .. ':webhooks', now + tonumber(ARGV[2]), due[1])
return due[1]
