-- schedule_retry.lua: record a failed attempt and when the next one may run
-- (Store.ScheduleRetry).
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- KEYS[2]  the stream (the same hash slot under Redis Cluster)
-- ARGV[1]  field, "<app>/<handler>"
-- ARGV[2]  attempt of the lease
-- ARGV[3]  token of the lease
-- ARGV[4]  backoff, ms (>= 0)
-- ARGV[5]  trace lineage of the attempt ('' = none)
-- ARGV[6]  consumer group
-- ARGV[7]  message id
--
-- Only when the field is running:<deadline_ms>:<attempt>:<token> with this
-- attempt and token, the field becomes
-- next_attempt_at:<now_ms + backoff>:<attempt>:<token>, now being the
-- server's TIME in ms, and a non-empty trace is stored in __trace:<field>.
--
-- Returns {code, ...}:
--   {1, next_ms}  scheduled; next_ms is the new deadline
--   {2}           stale: the field is not running with this attempt and token
--   {3}           terminal: __terminal is set, or the message is not in
--                 the group's PEL (prelude.lua fence); nothing changed

local key, field, token = KEYS[1], ARGV[1], ARGV[3]
local attempt = tonumber(ARGV[2])
local backoff_ms = tonumber(ARGV[4])

local code = fence(key, field, RUNNING, attempt, token, KEYS[2], ARGV[6], ARGV[7])
if code ~= 0 then
  return {code}
end

local next_ms = now_ms() + backoff_ms
redis.call('HSET', key, field, string.format('next_attempt_at:%d:%d:%s', next_ms, attempt, token))
save_trace(key, field, ARGV[5])
return {1, next_ms}
