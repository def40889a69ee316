-- finish_settle.lua: record that the last unfinished invocation of each of
-- a batch of messages succeeded, acknowledge those messages and switch
-- their state to terminal retention, in one step (Store.FinishSettle). One
-- call takes the messages of one stream and group, so that concurrent
-- deliveries share a script run and one XACK.
--
-- KEYS[1]    the source stream (the same hash slot under Redis Cluster)
-- KEYS[i+1]  invocation hash of message i, keys.Invocation(stream, group, id)
-- ARGV[1]    consumer group
-- ARGV[2]    ttl of a retained hash, ms (>= 1)
-- ARGV       then for each message i, in KEYS order: field
--            ("<app>/<handler>"), attempt and token of the lease, message id
--
-- The caller knows every other invocation of each message is terminal. Only
-- for a field running:<deadline_ms>:<attempt>:<token> with its lease's
-- attempt and token does anything change: the field becomes "ok",
-- __terminal is set with a TTL of ttl, and the message is acknowledged
-- (XACK). This is Finish, then XACK, then Retain, without a round trip or a
-- crash between them.
--
-- Returns one code per message, in KEYS order:
--   1  finished, acknowledged and retained
--   2  stale: the field is not running with this attempt and token;
--      nothing changed and the message was not acknowledged
--   3  terminal: __terminal is set; nothing changed

local ttl_ms = ARGV[2]
local codes, acked = {}, {}
for k = 2, #KEYS do
  local a = 3 + (k - 2) * 4
  local key, field, token = KEYS[k], ARGV[a], ARGV[a + 2]
  local code = fence(key, field, RUNNING, tonumber(ARGV[a + 1]), token)
  if code == 0 then
    redis.call('HSET', key, field, 'ok', '__terminal', '1')
    redis.call('PEXPIRE', key, ttl_ms)
    acked[#acked + 1] = ARGV[a + 3]
    code = 1
  end
  codes[k - 1] = code
end
if #acked > 0 then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(acked))
end
return codes
