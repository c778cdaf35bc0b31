-- complete.lua: finish a page (see finish in common.lua), unless it or its job already ended.
-- ARGV[2]: job; ARGV[3]: seq; ARGV[4]: outcome JSON {state, result_path, error};
-- ARGV[5]: the page's event JSON (pages_done and pages_total are added here).
-- Returns {counted 1/0, the job's final status if this page ended it, else ''}.

return finish(ARGV[2], ARGV[3], string.format('%s:%06d', ARGV[2], tonumber(ARGV[3])), cjson.decode(ARGV[4]),
              cjson.decode(ARGV[5]))
