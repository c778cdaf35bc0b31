-- renew.lua: extend the leases of pages still held with the given tokens.
-- ARGV[2]: lease, seconds; then triples ARGV[3+3i..5+3i]: job, seq, token.
-- Returns the 0-based positions of the triples whose claim was lost (re-claimed or finished).

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
