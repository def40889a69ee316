-- claim.lua: decide whether deliveries may run a new attempt of invocation
-- fields and, where they may, record the claims (Store.Claim). One call
-- takes a batch of claims, of messages of one stream (one hash slot), so
-- that concurrent deliveries share a script run.
--
-- KEYS     for each claim i, two keys: KEYS[2i-1] its invocation hash,
--          keys.Invocation(stream, group, message id), and KEYS[2i] its
--          stream (the same hash slot under Redis Cluster)
-- ARGV     for each claim i, in KEYS order, a segment:
--            field, "<app>/<handler>"
--            lease, ms (>= 1): a new attempt runs until now + lease
--            token for this claim (hex, no ':')
--            max attempts (>= 1): the rule's retries + 1
--            flags: 'c' when the record below is complete (every
--              invocation of the message), 'p' for a probe (record the
--              field due instead of claiming it), both, or '-'
--            consumer group, message id
--            n, then n other invocation fields of the message to record as
--              next_attempt_at:<now>:0:<token> (due, no attempt used)
--              unless they have state; with a complete record __matched
--              is set to '1'. A first delivery records, others pass 0.
--
-- Recording the message's invocations at its first delivery is what lets a
-- redelivery run exactly those, even when it would no longer match some of
-- them (a now() cutoff passed, a template changed) and when the worker died
-- before claiming them.
--
-- A claim of a message that is not in the group's PEL (acknowledged, or its
-- reference cleared) is inert, as on a retained hash: reply 7, nothing
-- written (prelude.lua pel_set and in_pel).
--
-- now is the server's TIME in Unix ms, read once for the batch. An attempt
-- that was claimed and whose lease expired counts as executed and failed.
-- When the next attempt would exceed max attempts, the field becomes
-- exhausted:<attempt>:<token> instead.
--
-- Returns one flat array: the replies of the claims, in KEYS order, one
-- after the other. Each reply starts with its code, which fixes its length
-- (Go: claimReplyLen); a flat array spares the server the conversion of a
-- nested table per claim (bench/RESULTS.md, section 1):
--   9, deadline_ms                    claimed attempt 1 of a field without
--                                     state: field = running:<deadline_ms>:1:<token>,
--                                     trace '' and lost 0
--   1, attempt, deadline_ms, trace, lost  claimed: field = running:<deadline_ms>:<attempt>:<token>
--   2, deadline_ms                    running: a live lease of another delivery
--   3, deadline_ms                    not due: next attempt allowed at deadline_ms
--   4                                 succeeded ("ok")
--   5, attempt, token, trace, lost    exhausted, DLQ entry not recorded yet
--   6, attempt, token, trace          exhausted, DLQ entry recorded (":dlq")
--   7                                 terminal: __terminal is set, or the
--                                     message is not in the group's PEL
--   8, value                          the stored value is malformed
--   11, attempts used, lost           probed: where a claim would take an
--                                     attempt, the field is recorded as
--                                     next_attempt_at:<now>:<attempts used>:<token>
--                                     (a lost attempt charged, none taken)
--   10                                voided: the field holds this claim's
--                                     token, which void.lua wrote when
--                                     the worker gave the claim up for
--                                     lost; nothing written
-- trace is the lineage of the latest attempt that stored one in
-- __trace:<field> (settle.lua's retry, exhaust and release), '' when none.
-- lost is the attempt whose expired lease this claim charged (its worker
-- died mid-run), 0 when none: counted once, by the claim that saw it.
-- Only codes 9, 1 and 11, code 5 when it follows an expired lease or a due
-- retry, and the recording write; no path touches the TTL.

local now = now_ms()
local now_s -- now in decimal, for recorded fields only
local replies, o = {}, 0

-- The PEL check of the claims of the first claim's stream and group, in
-- one XPENDING (prelude.lua pel_set); it answers for those claims only.
local pel, none, ids, m = {}, {}, {}, 0
local i = 1
for k = 1, #KEYS, 2 do
  if KEYS[k + 1] == KEYS[2] and ARGV[i + 5] == ARGV[6] then
    m = m + 1
    ids[m] = ARGV[i + 6]
  end
  i = i + 8 + tonumber(ARGV[i + 7])
end
if m > 1 then
  pel = pel_set(KEYS[2], ARGV[6], ids, m)
end

i = 1
for k = 1, #KEYS, 2 do
  local n = tonumber(ARGV[i + 7])
  if n > 0 and not now_s then
    now_s = string.format('%d', now)
  end
  local mine = pel
  if KEYS[k + 1] ~= KEYS[2] or ARGV[i + 5] ~= ARGV[6] then
    mine = none -- another stream or group: the same id may be pending there
  end
  local r = claim_one(KEYS[k], KEYS[k + 1], ARGV[i + 5], ARGV[i + 6], ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2],
    tonumber(ARGV[i + 3]), string.find(ARGV[i + 4], 'c', 1, true) ~= nil, string.find(ARGV[i + 4], 'p', 1, true) ~= nil,
    i + 8, n, now, now_s, mine)
  if type(r) == 'number' then
    replies[o + 1], replies[o + 2] = 9, r
    o = o + 2
  else
    for j = 1, #r do
      replies[o + j] = r[j]
    end
    o = o + #r
  end
  i = i + 8 + n
end
return replies
