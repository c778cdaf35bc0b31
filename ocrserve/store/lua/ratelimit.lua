-- ratelimit.lua: weigh a request against a token bucket shared by every gateway on this Redis
-- (RFC 2697's committed rate and burst size, counted in requests; the same bucket as
-- ocrserve.api.ratelimit.TokenBucket keeps in memory).
-- ARGV[2]: the bucket's name (policy and identity); ARGV[3]: rate, tokens gained per second (> 0);
-- ARGV[4]: burst, the bucket's size in tokens (>= 1); ARGV[5]: '1' to take a token when one is
-- there, '0' to look only.
-- Key P:ratelimit:{name}, a hash: tokens (as of stamp) and stamp (this server's clock, Unix seconds,
-- from TIME in common.lua, so gateways with skewed clocks agree). An absent bucket is a full one;
-- a bucket expires (PEXPIRE) when it would be full again, so idle ones vanish.
-- Returns {1 if a token was there else 0, tokens left as a string (Redis truncates Lua numbers)}.

local key = P .. ':ratelimit:' .. ARGV[2]
local rate, burst, take = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1'
local held = redis.call('HMGET', key, 'tokens', 'stamp')
local tokens = burst
if held[1] and held[2] then
  tokens = math.min(burst, tonumber(held[1]) + math.max(0, now - tonumber(held[2])) * rate)
end
local allowed = tokens >= 1
if allowed and take then
  tokens = tokens - 1
  redis.call('HSET', key, 'tokens', string.format('%.17g', tokens), 'stamp', string.format('%.17g', now))
  redis.call('PEXPIRE', key, string.format('%d', math.max(1, math.ceil((burst - tokens) / rate * 1000))))
end
return {allowed and 1 or 0, string.format('%.17g', tokens)}
