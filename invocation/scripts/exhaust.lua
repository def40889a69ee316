-- exhaust.lua: record that the last allowed attempt failed (Store.Exhaust).
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- KEYS[2]  the stream (the same hash slot under Redis Cluster)
-- ARGV[1]  field, "<app>/<handler>"
-- ARGV[2]  attempt of the lease
-- ARGV[3]  token of the lease
-- ARGV[4]  trace lineage of the attempt ('' = none)
-- ARGV[5]  consumer group
-- ARGV[6]  message id
--
-- Only when the field is running:<deadline_ms>:<attempt>:<token> with this
-- attempt and token, the field becomes exhausted:<attempt>:<token>, and a
-- non-empty trace is stored in __trace:<field>.
--
-- Returns {code}:
--   {1}  exhausted
--   {2}  stale: the field is not running with this attempt and token
--   {3}  terminal: __terminal is set, or the message is not in the
--        group's PEL (prelude.lua fence); nothing changed

local key, field, token = KEYS[1], ARGV[1], ARGV[3]
local attempt = tonumber(ARGV[2])

local code = fence(key, field, RUNNING, attempt, token, KEYS[2], ARGV[5], ARGV[6])
if code ~= 0 then
  return {code}
end

redis.call('HSET', key, field, string.format('exhausted:%d:%s', attempt, token))
save_trace(key, field, ARGV[4])
return {1}
