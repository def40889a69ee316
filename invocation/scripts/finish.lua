-- finish.lua: record that a claimed attempt succeeded (Store.Finish).
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- KEYS[2]  the stream (the same hash slot under Redis Cluster)
-- ARGV[1]  field, "<app>/<handler>"
-- ARGV[2]  attempt of the lease
-- ARGV[3]  token of the lease
-- ARGV[4]  consumer group
-- ARGV[5]  message id
--
-- Only when the field is running:<deadline_ms>:<attempt>:<token> with this
-- attempt and token (an expired deadline does not matter as long as nobody
-- claimed since), the field becomes "ok". An "ok" already stored is stale
-- too: it carries no token, so it cannot prove this lease wrote it.
--
-- Returns {code}:
--   {1}  finished
--   {2}  stale: the field is not running with this attempt and token
--   {3}  terminal: __terminal is set, or the message is not in the
--        group's PEL (prelude.lua fence); nothing changed

local key, field, token = KEYS[1], ARGV[1], ARGV[3]
local attempt = tonumber(ARGV[2])

local code = fence(key, field, RUNNING, attempt, token, KEYS[2], ARGV[4], ARGV[5])
if code ~= 0 then
  return {code}
end

redis.call('HSET', key, field, 'ok')
return {1}
