-- cancel.lua: cancel a job: its queued and running pages become cancelled and leave every queue.
-- ARGV[2]: job.
-- Returns 0 for an unknown job, else 1 (also when it had already ended, which it leaves as it was).

local job = ARGV[2]
local jkey, pkey = P .. ':job:' .. job, P .. ':page:' .. job
local status = redis.call('HGET', jkey, 'status')
if not status then return 0 end
if TERMINAL[status] then return 1 end
local pages = redis.call('HGETALL', pkey)
local cancelled = 0
for i = 1, #pages, 2 do
  local page = cjson.decode(pages[i + 1])
  if OPEN[page.state] then
    page.state, page.owner, page.token = 'cancelled', nil, nil
    redis.call('HSET', pkey, pages[i], cjson.encode(page))
    unclaim(string.format('%s:%06d', job, tonumber(pages[i])))
    cancelled = cancelled + 1
  end
end
unpend(job, cancelled)
job_ended(job, 'cancelled')
return 1
