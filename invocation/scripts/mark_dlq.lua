-- mark_dlq.lua: record that the DLQ entry of an exhausted invocation is
-- persisted (Store.MarkDLQ). Idempotent.
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- KEYS[2]  the stream (the same hash slot under Redis Cluster)
-- ARGV[1]  field, "<app>/<handler>"
-- ARGV[2]  attempt of the lease
-- ARGV[3]  token of the lease
-- ARGV[4]  consumer group
-- ARGV[5]  message id
--
-- exhausted:<attempt>:<token> with this attempt and token becomes
-- exhausted:<attempt>:<token>:dlq; that value already stored is left as is.
--
-- Returns {code}:
--   {1}  marked
--   {2}  stale: the field is not exhausted with this attempt and token
--   {3}  terminal: __terminal is set, or the message is not in the
--        group's PEL (prelude.lua fence); nothing changed
--   {4}  already marked; nothing changed

local key, field, token = KEYS[1], ARGV[1], ARGV[3]
local attempt = tonumber(ARGV[2])

local code, v, dlq = fence(key, field, EXHAUSTED, attempt, token, KEYS[2], ARGV[4], ARGV[5])
if code ~= 0 then
  return {code}
end
if dlq == ':dlq' then
  return {4}
end
if dlq ~= '' then
  return {2}
end

redis.call('HSET', key, field, v .. ':dlq')
return {1}
