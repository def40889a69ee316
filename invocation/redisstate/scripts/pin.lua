-- pin.lua: store a reserved value once per message, first writer wins
-- (Store.Pin; the __schedule pin of a schedule occurrence,
-- docs/schedules.md#pinning).
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- KEYS[2]  the stream (the same hash slot under Redis Cluster)
-- ARGV[1]  reserved field, "__<name>"
-- ARGV[2]  value to store when the field is absent
-- ARGV[3]  consumer group
-- ARGV[4]  message id
--
-- Returns {code, value}:
--   {1, value}   stored now; value is ARGV[2]
--   {4, value}   already pinned; value is the stored one, ARGV[2] ignored
--   {3}          terminal: __terminal is set, or the message is not in
--                the group's PEL (prelude.lua in_pel); nothing changed

local key, field = KEYS[1], ARGV[1]

if redis.call('HEXISTS', key, '__terminal') == 1 or not in_pel(KEYS[2], ARGV[3], ARGV[4]) then
  return {3}
end

local stored = redis.call('HGET', key, field)
if stored then
  return {4, stored}
end

redis.call('HSET', key, field, ARGV[2])
return {1, ARGV[2]}
