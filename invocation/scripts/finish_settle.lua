-- finish_settle.lua: record that the last unfinished invocation of each of
-- a batch of messages succeeded, acknowledge those messages and apply the
-- retention of their state, in one step (Store.FinishSettle). One call
-- takes the messages of one stream and group, so that concurrent
-- deliveries share a script run and one XACK.
--
-- KEYS[1]    the source stream (the same hash slot under Redis Cluster)
-- KEYS[i+1]  invocation hash of message i, keys.Invocation(stream, group, id)
-- ARGV[1]    consumer group
-- ARGV[2]    retention of the hashes, ms: '0' deletes them, else the TTL
-- ARGV       then for each message i, in KEYS order: field
--            ("<app>/<handler>"), attempt and token of the lease, message id
--
-- The caller knows every other invocation of each message is terminal. Only
-- for a message still in the group's PEL whose field is
-- running:<deadline_ms>:<attempt>:<token> with its lease's attempt and
-- token does anything change (prelude.lua fence): the message is
-- acknowledged (XACK) and its hash deleted (retention 0: the XACK's reply
-- is the PEL check), or its field becomes "ok" and __terminal is set with
-- a TTL of the retention (one XACK for the batch). This is
-- Finish, then XACK, then Retain, without a round trip or a crash between
-- them, so with retention 0 no hash outlives the XACK.
--
-- Returns one code per message, in KEYS order:
--   1  finished, acknowledged and retained (or deleted)
--   2  stale: the field is not running with this attempt and token;
--      nothing changed and the message was not acknowledged
--   3  terminal: __terminal is set, or the message is not in the group's
--      PEL; nothing changed

local group, ttl_ms = ARGV[1], ARGV[2]
local codes, acked = {}, {}
for k = 2, #KEYS do
  local a = 3 + (k - 2) * 4
  local key, field, attempt, token, id = KEYS[k], ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3]
  local code
  if ttl_ms == '0' then
    -- The XACK's count says whether the message was pending: a deletion
    -- needs no memory, so nothing can fail after it.
    code = match(key, field, RUNNING, attempt, token)
    if code == 0 then
      if redis.call('XACK', KEYS[1], group, id) == 1 then
        redis.call('DEL', key)
        code = 1
      else
        code = 3
      end
    elseif code == 2 and not in_pel(KEYS[1], group, id) then
      code = 3
    end
  else
    -- Checked first, so that a Redis at maxmemory refuses the HSET before
    -- anything is acknowledged.
    code = fence(key, field, RUNNING, attempt, token, KEYS[1], group, id)
    if code == 0 then
      redis.call('HSET', key, field, 'ok', '__terminal', '1')
      redis.call('PEXPIRE', key, ttl_ms)
      acked[#acked + 1] = id
      code = 1
    end
  end
  codes[k - 1] = code
end
if #acked > 0 then
  redis.call('XACK', KEYS[1], group, unpack(acked))
end
return codes
