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
--              field due instead of claiming it), 'g' for a gate (below),
--              any of them together, or '-'
--            consumer group, message id
--            n, then n other invocation fields of the message to record as
--              next_attempt_at:<now>:0:<token> (due, no attempt used)
--              unless they have state; with a complete record __matched
--              is set to '1'. A first delivery records, others pass 0.
--            with flag 'g' (a gate, never with 'p'), 7 more: slots, the
--              slots key ('' with 0 slots), rate interval in µs (0 for
--              none), burst, the rate key, debounce period in ms (0 for
--              none), the debounce key (keys.Limit; all in the stream's
--              hash slot, which is what Redis Cluster needs of keys a
--              script is not given in KEYS)
--
-- Recording the message's invocations at its first delivery is what lets a
-- redelivery run exactly those, even when it would no longer match some of
-- them (a now() cutoff passed, a template changed) and when the worker died
-- before claiming them.
--
-- A claim of a message that is not in the group's PEL (acknowledged, or its
-- reference cleared) is inert, as on a retained hash: reply 15, nothing
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
--   2, deadline_ms, attempt           running: a live lease of another delivery
--   3, deadline_ms, attempts used     not due: next attempt allowed at deadline_ms
--   4                                 succeeded ("ok")
--   5, attempt, token, trace, lost    exhausted, DLQ entry not recorded yet
--   6, attempt, token, trace          exhausted, DLQ entry recorded (":dlq")
--   7                                 terminal: __terminal is set
--   15                                not pending: the message is not in
--                                     the group's PEL
--   8, value                          the stored value is malformed
--   11, attempts used, lost           probed: where a claim would take an
--                                     attempt, the field is recorded as
--                                     next_attempt_at:<now>:<attempts used>:<token>
--                                     (a lost attempt charged, none taken)
--   12, 'c' or 'r', us                throttled by the gate's slots ('c') or
--                                     rate ('r') until us (µs)
--   13, due_ms                        debounced until due_ms
--   14, newer id                      superseded by a newer event of the
--                                     debounce group: field = superseded:<newer id>
--   (12 and 13 record a field without state as next_attempt_at:<now>:0:<token>
--    and leave one with state as it is: nothing is charged; prelude.lua gate_pass)
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

-- One pass over the segments: where each starts, whether any has a gate,
-- and the ids of the claims of the first claim's stream and group, whose
-- PEL check is one XPENDING (prelude.lua pel_set) that answers for those
-- claims only.
local at, gated = {}, false
local pel, none, ids, m = {}, {}, {}, 0
local i = 1
for k = 1, #KEYS, 2 do
  at[k] = i
  if KEYS[k + 1] == KEYS[2] and ARGV[i + 5] == ARGV[6] then
    m = m + 1
    ids[m] = ARGV[i + 6]
  end
  local size = 8 + tonumber(ARGV[i + 7])
  if string.find(ARGV[i + 4], 'g', 1, true) then
    gated = true
    size = size + 7
  end
  i = i + size
end
if m > 1 then
  pel = pel_set(KEYS[2], ARGV[6], ids, m)
end

-- The server's TIME, read once for the batch: in ms, and for a batch with
-- a gate in µs too (a rate's interval may be under a millisecond).
local now, now_u
if gated then
  now_u = now_us()
  now = math.floor(now_u / 1000)
else
  now = now_ms()
end
local now_s -- now in decimal, for recorded fields only
local replies, o = {}, 0

for k = 1, #KEYS, 2 do
  i = at[k]
  local n = tonumber(ARGV[i + 7])
  if n > 0 and not now_s then
    now_s = string.format('%d', now)
  end
  local mine = pel
  if KEYS[k + 1] ~= KEYS[2] or ARGV[i + 5] ~= ARGV[6] then
    mine = none -- another stream or group: the same id may be pending there
  end
  local gate
  if string.find(ARGV[i + 4], 'g', 1, true) then
    local g = i + 8 + n
    gate = {slots = tonumber(ARGV[g]), slots_key = ARGV[g + 1], interval = tonumber(ARGV[g + 2]),
      burst = tonumber(ARGV[g + 3]), rate_key = ARGV[g + 4], period = tonumber(ARGV[g + 5]), debounce = ARGV[g + 6]}
  end
  local r = claim_one(KEYS[k], KEYS[k + 1], ARGV[i + 5], ARGV[i + 6], ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2],
    tonumber(ARGV[i + 3]), string.find(ARGV[i + 4], 'c', 1, true) ~= nil, string.find(ARGV[i + 4], 'p', 1, true) ~= nil,
    i + 8, n, now, now_s, mine, gate, now_u)
  if type(r) == 'number' then
    replies[o + 1], replies[o + 2] = 9, r
    o = o + 2
  else
    for j = 1, #r do
      replies[o + j] = r[j]
    end
    o = o + #r
  end
end
return replies
