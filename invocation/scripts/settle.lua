-- settle.lua: acknowledge a message and apply the retention of its
-- invocation state, in one step (Store.Settle): the ack of the DLQ,
-- obsolete-schedule and other paths where every invocation is terminal
-- already. Idempotent.
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- KEYS[2]  the stream (the same hash slot under Redis Cluster)
-- ARGV[1]  consumer group
-- ARGV[2]  message id
-- ARGV[3]  retention, ms: '0' deletes the hash, else its TTL
--
-- Only when the message is in the group's PEL (prelude.lua in_pel) is its
-- hash deleted or retained (prelude.lua retain) and the message
-- acknowledged (XACK), so with retention 0 no hash outlives the XACK. The
-- retention is written first: a Redis at maxmemory refuses its HSET
-- before anything changed, and the message stays pending rather than
-- acknowledged with its hash left behind (a DEL needs no memory). A message no
-- longer pending was settled by another delivery (or its reference was
-- cleared): a stale delivery then changes nothing, and recreates nothing.
--
-- Returns {code}:
--   {1}  acknowledged, and the retention applied
--   {3}  the message is not in the group's PEL; nothing changed

local key, group, id = KEYS[1], ARGV[1], ARGV[2]
if ARGV[3] == '0' then
  -- The XACK's count is the PEL check; a deletion needs no memory.
  if redis.call('XACK', KEYS[2], group, id) == 0 then
    return {3}
  end
  redis.call('DEL', key)
  return {1}
end
if not in_pel(KEYS[2], group, id) then
  return {3}
end
retain(key, ARGV[3])
redis.call('XACK', KEYS[2], group, id)
return {1}
