-- finish_settle.lua: record that the last unfinished invocation of a
-- message succeeded, acknowledge the message and switch its state to
-- terminal retention, in one step (Store.FinishSettle).
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- KEYS[2]  the source stream (the same hash slot under Redis Cluster)
-- ARGV[1]  field, "<app>/<handler>"
-- ARGV[2]  attempt of the lease
-- ARGV[3]  token of the lease
-- ARGV[4]  consumer group
-- ARGV[5]  message id
-- ARGV[6]  ttl of the retained hash, ms (>= 1)
--
-- The caller knows every other invocation of the message is terminal. Only
-- when the field is running:<deadline_ms>:<attempt>:<token> with this attempt
-- and token does anything change: the field becomes "ok", __terminal is set
-- with a TTL of ttl, and the message is acknowledged (XACK). This is Finish,
-- then XACK, then Retain, without a round trip or a crash between them.
--
-- Returns {code}:
--   {1}  finished, acknowledged and retained
--   {2}  stale: the field is not running with this attempt and token;
--        nothing changed and nothing was acknowledged
--   {3}  terminal: __terminal is set; nothing changed

local key, field, token = KEYS[1], ARGV[1], ARGV[3]
local attempt = tonumber(ARGV[2])

local code = fence(key, field, RUNNING, attempt, token)
if code ~= 0 then
  return {code}
end

redis.call('HSET', key, field, 'ok', '__terminal', '1')
redis.call('PEXPIRE', key, ARGV[6])
redis.call('XACK', KEYS[2], ARGV[4], ARGV[5])
return {1}
