-- settle.lua: apply a batch of settlements (Store.Settle), each one
-- atomically: the transitions of one message's invocations, the dead-letter
-- entries they write, and, when the settlement says so, the message's
-- acknowledgement and the retention of its state
-- (docs/delivery.md#from-entry-to-acknowledgement). This is the only
-- script that changes an invocation after its claim, and, apart from
-- retain_acked.lua (a leaked hash), the only one that acknowledges or
-- retains.
--
-- KEYS[1]    the source stream
-- KEYS[2]    its dead-letter stream, keys.DLQ(stream) (the same hash slot
--            under Redis Cluster, as every key here)
-- KEYS[i+2]  invocation hash of settlement i, keys.Invocation(stream, group, id)
-- ARGV[1]    consumer group
-- ARGV       then for each settlement i, in KEYS order, a segment:
--              message id
--              flags: 'a' acknowledge, 's' the message has no state (with
--                'a': the XACK alone), 'c' its PEL reference was cleared
--                (apply the retention, nothing else), or '-'
--              retention, ms: '0' deletes the hash, else its TTL
--              n, the number of transitions, then n transitions of
--                8 + 2m arguments each:
--                kind: 'f' finish, 'r' retry, 'x' exhaust, 'd' dead-letter,
--                  'l' release
--                field, attempt, token of the lease
--                trace lineage ('' = none)
--                backoff, ms (retry; '0' otherwise)
--                a key: for finish, retry, exhaust and release the slots
--                  key of the claim's gate whose slot the transition gives
--                  back; for dead-letter the marker the previous version
--                  of Relay wrote once the entry was written
--                  (keys.LegacyDLQWritten); '' for none. In the stream's
--                  hash slot.
--                m, then m field/value pairs of the dead-letter entry
--                  (exhaust, dead-letter; m = 0 otherwise)
--
-- A settlement changes nothing unless every one of its transitions is
-- fenced right: finish, retry, exhaust and release need the field
-- running:<deadline_ms>:<attempt>:<token> with the lease's attempt and
-- token; dead-letter needs exhausted:<attempt>:<token>. An exhaust or
-- dead-letter whose field is already exhausted:<attempt>:<token>:dlq was
-- applied before (a retry after a lost reply, or another delivery that
-- found the same exhausted attempt): it writes no second entry. Nor does
-- anything change on a retained hash (__terminal) or for a message no
-- longer in the group's PEL: with 'a' the XACK's count is that check (it
-- costs a fraction of an XPENDING, whose nested reply the script would
-- convert), otherwise one XPENDING of the id (prelude.lua in_pel).
--
-- Then, in order: the XACK; the transitions (finish: "ok"; retry:
-- next_attempt_at:<now + backoff>:<attempt>:<token>; exhaust and
-- dead-letter: the entry appended (XADD <dlq> *), the field
-- exhausted:<attempt>:<token>:dlq and the entry's id in __dlq:<field>;
-- release: next_attempt_at:<now>:<attempt
-- - 1>:<token>), a non-empty trace stored in __trace:<field> by retry,
-- exhaust and release, the slot of a transition with a slots key given
-- back (ZREM of the message id); and with 'a' the retention: the hash deleted, or
-- __terminal set with a TTL. So with retention 0 nothing of the message
-- outlives its XACK but its dead-letter entries. On a Redis at maxmemory
-- the XACK, which needs no memory, is the first write, and a script that
-- has written may finish its writes (Redis refuses only a script's first
-- write that needs memory): a settlement that acknowledges drains a full
-- Redis rather than holding its message pending
-- (docs/delivery.md#claim-errors-fail-closed). Store.Settle puts the
-- settlements that acknowledge first in a call (settleOrder), so that
-- another one's refused write cannot hold them back.
--
-- Returns one flat array: for each settlement, in KEYS order, its code
-- and, for code 1, one element per transition:
--   1, r1 .. rn  applied; r is the next attempt's time in ms for a retry,
--                the new entry's id for an exhaust or dead-letter ('' when
--                it was written before), 0 otherwise
--   2            stale: a transition's field is not what its lease needs
--   3            terminal: __terminal is set, or the message is not in
--                the group's PEL (for 'c': still in it, code 5)
--   5            'c' on a message still pending: nothing changed

local stream, dlq, group = KEYS[1], KEYS[2], ARGV[1]
local now -- the server's TIME in ms, read once, when a retry or release needs it
local out, o = {}, 0

local function time_ms()
  if not now then
    now = now_ms()
  end
  return now
end

local i = 2
for k = 3, #KEYS do
  local key, id, flags, ttl, n = KEYS[k], ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  if n == 1 and flags == 'a' and ARGV[i + 4] == 'f' and ARGV[i + 10] == '' then
    -- The common case, a success that acknowledges, without the tables
    -- of the general path below: each costs the server more than the
    -- hash command it serves (bench/RESULTS.md, section 1).
    local field, attempt, token = ARGV[i + 5], tonumber(ARGV[i + 6]), ARGV[i + 7]
    local got = redis.call('HMGET', key, '__terminal', field)
    local code = 1
    if got[1] then
      code = 3
    else
      local va, vtok = string.match(got[2] or '', RUNNING)
      if not va or tonumber(va) ~= attempt or vtok ~= token then
        code = 2
        if not in_pel(stream, group, id) then
          code = 3
        end
      elseif redis.call('XACK', stream, group, id) == 0 then
        code = 3
      elseif ttl == '0' then
        redis.call('DEL', key)
      else
        redis.call('HSET', key, field, 'ok', '__terminal', '1')
        redis.call('PEXPIRE', key, ttl)
      end
    end
    out[o + 1] = code
    o = o + 1
    if code == 1 then
      out[o + 1] = 0
      o = o + 1
    end
    i = i + 12 -- the segment's 4 arguments and the transition's 8
  else
    local ack, stateless, cleared = string.find(flags, 'a', 1, true), string.find(flags, 's', 1, true), string.find(flags, 'c', 1, true)
    -- Where each transition's arguments start, and its field.
    local at, fields = {}, {}
    local j = i + 4
    for t = 1, n do
      at[t], fields[t] = j, ARGV[j + 1]
      j = j + 8 + 2 * tonumber(ARGV[j + 7])
    end
    i = j

    local code = 1
    local done = {} -- transitions applied before: no second entry
    local legacy = {} -- dead-letters the previous version wrote: their entry ids
    if cleared then
      if in_pel(stream, group, id) then
        code = 5
      else
        retain(key, ttl)
      end
    elseif n > 0 then
      local got = redis.call('HMGET', key, '__terminal', unpack(fields))
      if got[1] then
        code = 3
      end
      for t = 1, n do
        if code ~= 1 then
          break
        end
        local a = at[t]
        local kind, attempt, token, v = ARGV[a], tonumber(ARGV[a + 2]), ARGV[a + 3], got[t + 1]
        local pattern = RUNNING
        if kind == 'd' then
          pattern = EXHAUSTED
        end
        local va, vtok, rest
        if v then
          va, vtok, rest = string.match(v, pattern)
        end
        if not va or tonumber(va) ~= attempt or vtok ~= token then
          -- An exhaust already written is one applied before.
          local xa, xtok, xrest
          if v and (kind == 'x' or kind == 'd') then
            xa, xtok, xrest = string.match(v, EXHAUSTED)
          end
          if xa and tonumber(xa) == attempt and xtok == token and xrest == ':dlq' then
            done[t] = true
          else
            code = 2
          end
        elseif kind == 'd' and rest == ':dlq' then
          done[t] = true
        elseif kind == 'd' and rest == '' and ARGV[a + 6] ~= '' then
          -- A worker of the previous version wrote the entry and its
          -- marker, and stopped before it marked the field: take its
          -- entry, write no second one.
          local written = redis.call('GET', ARGV[a + 6])
          if written then
            done[t], legacy[t] = true, written
          end
        elseif kind == 'd' and rest ~= '' then
          code = 2
        end
      end
    end

    if code == 1 and not cleared then
      if ack then
        if redis.call('XACK', stream, group, id) == 0 then
          code = 3
        end
      elseif not in_pel(stream, group, id) then
        code = 3
      end
    elseif code == 2 and not cleared and not in_pel(stream, group, id) then
      code = 3
    end

    out[o + 1] = code
    o = o + 1
    if code == 1 and not cleared then
      local gone = ack and ttl == '0' -- the hash is deleted below
      local w, m = {}, 0
      for t = 1, n do
        local a = at[t]
        local kind, field, attempt, token, trace = ARGV[a], fields[t], tonumber(ARGV[a + 2]), ARGV[a + 3], ARGV[a + 4]
        local r = 0
        if kind == 'f' then
          w[m + 1], w[m + 2], m = field, 'ok', m + 2
        elseif kind == 'r' then
          r = time_ms() + tonumber(ARGV[a + 5])
          w[m + 1], w[m + 2], m = field, string.format('next_attempt_at:%d:%d:%s', r, attempt, token), m + 2
        elseif kind == 'l' then
          w[m + 1], w[m + 2], m = field, string.format('next_attempt_at:%d:%d:%s', time_ms(), attempt - 1, token), m + 2
        elseif legacy[t] then
          r = ''
          w[m + 1], w[m + 2], m = field, string.format('exhausted:%d:%s:dlq', attempt, token), m + 2
          w[m + 1], w[m + 2], m = '__dlq:' .. field, legacy[t], m + 2
        elseif done[t] then
          r = ''
        else
          local np = tonumber(ARGV[a + 7])
          r = redis.call('XADD', dlq, '*', unpack(ARGV, a + 8, a + 7 + 2 * np))
          w[m + 1], w[m + 2], m = field, string.format('exhausted:%d:%s:dlq', attempt, token), m + 2
          w[m + 1], w[m + 2], m = '__dlq:' .. field, r, m + 2
        end
        if ARGV[a + 6] ~= '' and kind ~= 'd' then
          redis.call('ZREM', ARGV[a + 6], id) -- the attempt gives its slot back
        end
        if trace ~= '' and (kind == 'r' or kind == 'l' or (kind == 'x' and not done[t])) then
          w[m + 1], w[m + 2], m = '__trace:' .. field, trace, m + 2
        end
        out[o + t] = r
      end
      o = o + n
      if gone then
        redis.call('DEL', key)
      elseif ack and m > 0 then
        w[m + 1], w[m + 2], m = '__terminal', '1', m + 2
        redis.call('HSET', key, unpack(w, 1, m))
        redis.call('PEXPIRE', key, ttl)
      else
        if m > 0 then
          redis.call('HSET', key, unpack(w, 1, m))
        end
        if ack and not stateless then
          retain(key, ttl)
        end
      end
    end
  end
end
return out
