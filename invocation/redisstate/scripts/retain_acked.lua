-- retain_acked.lua: apply the retention to a leaked invocation hash, one
-- left without a TTL after its message left the PEL (a crash between an
-- XAUTOCLAIM that cleared its reference and the Cleared settlement, or an
-- XACK from outside Store.Settle): delete it (retention 0) or switch it to
-- terminal retention, unless its message is still pending
-- (Store.RetainAcked, run by RetainLeaked). Idempotent.
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- KEYS[2]  the stream (the same hash slot under Redis Cluster)
-- ARGV[1]  the consumer group
-- ARGV[2]  the message id
-- ARGV[3]  retention, ms: '0' deletes the hash, else its TTL
--
-- A hash with a TTL is left alone: retained already, or expiring anyway.
-- A hash whose message is in the group's PEL (XPENDING <stream> <group>
-- <id> <id> 1) is left alone: it is still recoverable and must keep its
-- markers. When the stream or the group does not exist nothing is changed
-- either: a group recreated from id 0 delivers the message again, and its
-- markers then still count. Otherwise the hash is deleted or retained
-- exactly as a Cleared settlement does (settle.lua, prelude.lua retain).
--
-- Returns {code}:
--   {1}  deleted, or retained now: the hash had no TTL and has __terminal
--        and the TTL
--   {4}  the hash has a TTL already: nothing changed
--   {5}  the message is still pending: nothing changed
--   {6}  the hash does not exist: nothing changed
--   {7}  the stream or the group does not exist: nothing changed

local key = KEYS[1]

local pttl = redis.call('PTTL', key)
if pttl == -2 then
  return {6}
end
if pttl >= 0 then
  return {4}
end

if redis.call('EXISTS', KEYS[2]) == 0 then
  return {7}
end
local p = redis.pcall('XPENDING', KEYS[2], ARGV[1], ARGV[2], ARGV[2], 1)
if type(p) == 'table' and p.err then
  if string.sub(p.err, 1, 8) == 'NOGROUP ' then
    return {7}
  end
  return redis.error_reply(p.err)
end
if #p > 0 then
  return {5}
end

retain(key, ARGV[3])
return {1}
