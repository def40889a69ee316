-- release.lua: give a claimed attempt back without charging it
-- (Store.Release).
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
-- attempt and token: the field becomes
-- next_attempt_at:<now_ms>:<attempt-1>:<token>, due at once, so the next
-- claim runs the same attempt number again; attempt 1 too (0 used), so the
-- invocation stays recorded as unfinished for a redelivery that no longer
-- matches its rule. now is the server's TIME in ms.
-- Either way a non-empty trace is stored in __trace:<field>, so the attempt
-- run again links to the one given back.
--
-- Returns {code}:
--   {1}  released
--   {2}  stale: the field is not running with this attempt and token
--   {3}  terminal: __terminal is set, or the message is not in the
--        group's PEL (prelude.lua fence); nothing changed

local key, field, token = KEYS[1], ARGV[1], ARGV[3]
local attempt = tonumber(ARGV[2])

local code = fence(key, field, RUNNING, attempt, token, KEYS[2], ARGV[5], ARGV[6])
if code ~= 0 then
  return {code}
end

save_trace(key, field, ARGV[4])
redis.call('HSET', key, field, string.format('next_attempt_at:%d:%d:%s', now_ms(), attempt - 1, token))
return {1}
