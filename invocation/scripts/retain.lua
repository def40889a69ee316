-- retain.lua: switch a message's invocation hash to terminal retention
-- after the message left the PEL (Store.Retain). Idempotent.
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- ARGV[1]  ttl, ms (>= 1)
--
-- Sets __terminal and a TTL of ttl, creating the hash if it is missing so
-- that late transitions of stale deliveries stay inert. Once __terminal is
-- set nothing changes: a running TTL is kept (a repeated Retain cannot
-- extend it); only a TTL removed from outside is put back (prelude.lua
-- retain).
--
-- Returns {code}:
--   {1}  retained now
--   {4}  already retained

return {retain(KEYS[1], ARGV[1])}
