-- finish_settle.lua: record that the last unfinished invocation of each of
-- a batch of messages succeeded, acknowledge those messages and apply the
-- retention of their state, in one step (Store.FinishSettle,
-- Store.FinishSettleBatch). One call takes the messages of one stream and
-- group, so that concurrent deliveries, or the messages of one read, share
-- a script run.
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
-- token does anything change: the message is acknowledged (XACK) and its
-- hash deleted (retention 0), or its field becomes "ok" and __terminal is
-- set with a TTL of the retention. The XACK's count is the PEL check: it
-- costs a fraction of an XPENDING, whose nested reply the script would
-- have to convert (bench/RESULTS.md, section 1). This is Finish, then
-- XACK, then Retain, without a round trip or a crash between them, so with
-- retention 0 no hash outlives the XACK.
--
-- On a Redis at maxmemory the XACK, which needs no memory, goes first, and
-- a script that has written may finish its writes (Redis refuses only a
-- script's first write that needs memory): the message is acknowledged and
-- its hash retained with a few bytes over the limit, so settling drains a
-- full Redis rather than holding its messages pending
-- (docs/delivery.md#claim-errors-fail-closed).
--
-- Returns one code per message, in KEYS order:
--   1  finished, acknowledged and retained (or deleted)
--   2  stale: the field is not running with this attempt and token;
--      nothing changed and the message was not acknowledged
--   3  terminal: __terminal is set, or the message is not in the group's
--      PEL; nothing changed

local group, ttl_ms = ARGV[1], ARGV[2]
local codes = {}
for k = 2, #KEYS do
  local a = 3 + (k - 2) * 4
  local key, field, attempt, token, id = KEYS[k], ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3]
  local code = match(key, field, RUNNING, attempt, token)
  if code == 0 then
    if redis.call('XACK', KEYS[1], group, id) == 0 then
      code = 3
    elseif ttl_ms == '0' then
      redis.call('DEL', key)
      code = 1
    else
      redis.call('HSET', key, field, 'ok', '__terminal', '1')
      redis.call('PEXPIRE', key, ttl_ms)
      code = 1
    end
  elseif code == 2 and not in_pel(KEYS[1], group, id) then
    code = 3
  end
  codes[k - 1] = code
end
return codes
