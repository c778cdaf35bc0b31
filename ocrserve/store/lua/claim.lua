-- claim.lua: return lapsed leases and due retries to P:ready, then claim up to `limit` pages,
-- best rank first, skipping pages of ended jobs; each claim gets a lease and a token.
-- ARGV[2]: owner; ARGV[3]: lease, seconds; ARGV[4]: limit; ARGV[5..]: one random token per claim.
-- Returns {{job, seq, document, index, attempts, token, lapsed_from}, ...}; lapsed_from: the owner
-- of the page's previous claim when its lease lapsed (the page was still running), else ''.

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
      local lapsed_from = ''
      if page.state == 'running' then
        lapsed_from = type(page.owner) == 'string' and page.owner or '?'
      end
      page.state, page.attempts, page.owner, page.token = 'running', page.attempts + 1, owner, ARGV[5 + #out]
      redis.call('HSET', pkey, seq, cjson.encode(page))
      redis.call('ZADD', P .. ':leases', now + lease, m)
      if status == 'queued' then redis.call('HSET', jkey, 'status', 'running') end
      table.insert(out, {job, tonumber(seq), page.document, page.index, page.attempts, page.token, lapsed_from})
    end
  end
end
return out
