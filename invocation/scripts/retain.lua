-- retain.lua: apply the retention of a message's invocation hash after the
-- message left the PEL (Store.Retain): the ack paths that acknowledge
-- without settle.lua (a StreamSource's own XACK, a PEL reference that
-- XAUTOCLAIM cleared). Idempotent.
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- KEYS[2]  the stream (the same hash slot under Redis Cluster)
-- ARGV[1]  consumer group
-- ARGV[2]  message id
-- ARGV[3]  retention, ms: '0' deletes the hash, else its TTL
--
-- A message still in the group's PEL keeps its state (it is recoverable):
-- nothing changes. Otherwise the hash is deleted or retained
-- (prelude.lua retain): __terminal and the TTL, a running TTL kept (a
-- repeated Retain cannot extend it), a TTL removed from outside put back;
-- a missing hash stays missing.
--
-- Returns {code}:
--   {1}  deleted, or retained now
--   {4}  already retained
--   {5}  the message is still pending; nothing changed
--   {6}  no hash; nothing changed

if in_pel(KEYS[2], ARGV[1], ARGV[2]) then
  return {5}
end
return {retain(KEYS[1], ARGV[3])}
