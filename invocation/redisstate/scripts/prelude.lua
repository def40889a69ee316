-- prelude.lua: helpers that scripts.go puts in front of the transition
-- scripts that use them (Redis scripts cannot load one another). Every
-- helper is one block that starts with a "-- helper: <name>" line; a script
-- gets the blocks whose names its code mentions (not its comments), and
-- those the blocks' code mentions. A script runs its whole chunk on every
-- call, so helpers it does not use would cost it time on each one.

-- helper: now_ms
-- now_ms returns the Redis server clock in Unix milliseconds, so worker
-- clock skew cannot change outcomes.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- helper: now_us
-- now_us returns the Redis server clock in Unix microseconds, for a rate
-- limit whose interval is under a millisecond (prelude.lua gate_pass). A
-- Lua number holds it exactly (it is under 2^53).
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- helper: newer_id
-- newer_id reports whether stream entry id a is newer than id b; an id
-- that is not <ms>-<seq> is never newer, and any id is newer than one
-- that is not.
local function newer_id(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  if not ams then
    return false
  end
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  if not bms then
    return true
  end
  ams, bms = tonumber(ams), tonumber(bms)
  return ams > bms or (ams == bms and tonumber(aseq) > tonumber(bseq))
end

-- helper: gate_pass
-- gate_pass decides the gate g of a claim (claim.lua, invocation.Gate) of
-- attempt of message id, at now (ms) and now_u (µs): nil when the claim
-- may take the attempt, its slot then held until deadline_ms and its
-- rate's turn used; otherwise the reply that defers it, having changed
-- nothing but the debounce group's record:
--   14, newer id   superseded: a newer event of the debounce group was
--                  recorded
--   13, due_ms     debounced: this event's period runs until due_ms (its
--                  first claim records it as the group's latest)
--   12, 'c', us    throttled: every slot is held; us is the end of the
--                  earliest lease
--   12, 'r', us    throttled: the rate's next turn is at us
-- The debounce record is kept an hour past the period
-- (invocation.DebounceKeep), so an older event claimed late is still
-- superseded. Slots are a sorted set of message ids scored by their
-- leases' ends, dropped once ended: a worker killed mid-run holds its
-- slot one lease at most. The rate is a GCRA: the key holds the
-- theoretical arrival time tat, a start is allowed at t >= tat - (burst -
-- 1) * interval and moves tat to tat + interval when it is at most a tenth
-- of an interval late (t <= tat + interval / 10: a worker's own delay
-- between its turn and its claim must not slow a backlog down), else to t
-- + interval; the key expires a tenth of an interval after tat has
-- passed, which is the same as no key.
local DEBOUNCE_KEEP_MS = 3600000
local function gate_pass(g, id, attempt, now, now_u, deadline_ms)
  if g.period > 0 then
    local d = redis.call('HMGET', g.debounce, 'id', 'due')
    local latest, due = d[1], tonumber(d[2])
    if latest and newer_id(latest, id) then
      return {14, latest}
    elseif latest == id then
      if now < due then
        return {13, due}
      end
    elseif attempt > 1 then
      -- It waited its period before its first attempt: a record that
      -- lapsed since does not make a retry wait again.
      redis.call('HSET', g.debounce, 'id', id, 'due', now)
      redis.call('PEXPIREAT', g.debounce, now + DEBOUNCE_KEEP_MS)
    else
      due = now + g.period
      redis.call('HSET', g.debounce, 'id', id, 'due', due)
      redis.call('PEXPIREAT', g.debounce, due + DEBOUNCE_KEEP_MS)
      return {13, due}
    end
  end
  if g.slots > 0 then
    redis.call('ZREMRANGEBYSCORE', g.slots_key, '-inf', now)
    if redis.call('ZCARD', g.slots_key) >= g.slots then
      local first = redis.call('ZRANGE', g.slots_key, 0, 0, 'WITHSCORES')
      return {12, 'c', tonumber(first[2]) * 1000}
    end
  end
  if g.interval > 0 then
    local tat = tonumber(redis.call('GET', g.rate_key)) or now_u
    local slack = math.floor(g.interval / 10)
    if tat + slack < now_u then
      tat = now_u
    end
    local allowed = tat - (g.burst - 1) * g.interval
    if now_u < allowed then
      return {12, 'r', allowed}
    end
    tat = tat + g.interval
    redis.call('SET', g.rate_key, string.format('%d', tat), 'PX', math.floor((tat + slack - now_u) / 1000) + 1)
  end
  if g.slots > 0 then
    redis.call('ZADD', g.slots_key, deadline_ms, id)
    if redis.call('PTTL', g.slots_key) < deadline_ms - now then
      redis.call('PEXPIRE', g.slots_key, deadline_ms - now + 1)
    end
  end
  return nil
end

-- helper: RUNNING
-- The pattern of a running value; captures are attempt and token.
local RUNNING = '^running:%d+:(%d+):([^:]+)$'

-- helper: EXHAUSTED
-- The pattern of an exhausted value; captures are attempt, token and the
-- rest of the value (':dlq' once the entry is written).
local EXHAUSTED = '^exhausted:(%d+):([^:]+)(.*)$'

-- helper: pel_range
-- pel_range returns the PEL entries of group on stream from id lo to id hi,
-- at most count (XPENDING's extended form, O(log n) in the PEL). A missing
-- stream or group (NOGROUP) has none; any other error is raised.
local function pel_range(stream, group, lo, hi, count)
  local p = redis.pcall('XPENDING', stream, group, lo, hi, count)
  if type(p) == 'table' and p.err then
    if string.sub(p.err, 1, 8) == 'NOGROUP ' then
      return {}
    end
    error(p)
  end
  return p
end

-- helper: in_pel
-- in_pel reports whether message id is in the PEL of group on stream. A
-- message that left the PEL (acknowledged, or its reference cleared) makes
-- every transition inert, whether or not its hash is retained
-- (docs/delivery.md#invocation-state).
local function in_pel(stream, group, id)
  return #pel_range(stream, group, id, id, 1) > 0
end

-- helper: pel_set
-- pel_set returns the set of those of ids (message ids, a table of n > 1)
-- that one XPENDING range finds in the PEL of group on stream: the range
-- from the lowest to the highest of them, at most 2n entries. The claims
-- of a batch are mostly one read's messages, a short run of ids, so one
-- range answers for all of them at a fraction of the cost of an XPENDING
-- each (bench/RESULTS.md, section 1). The set only says yes: an id it
-- lacks (the range held other entries, or ids beyond what a Lua number
-- holds exactly misordered it) is asked with in_pel.
local function pel_set(stream, group, ids, n)
  local lo, hi, lo_ms, lo_seq, hi_ms, hi_seq
  for j = 1, n do
    local ms, seq = string.match(ids[j], '^(%d+)-(%d+)$')
    if not ms then
      return {}
    end
    ms, seq = tonumber(ms), tonumber(seq)
    if not lo or ms < lo_ms or (ms == lo_ms and seq < lo_seq) then
      lo, lo_ms, lo_seq = ids[j], ms, seq
    end
    if not hi or ms > hi_ms or (ms == hi_ms and seq > hi_seq) then
      hi, hi_ms, hi_seq = ids[j], ms, seq
    end
  end
  local set = {}
  local p = pel_range(stream, group, lo, hi, 2 * n)
  for j = 1, #p do
    set[p[j][1]] = true
  end
  return set
end

-- helper: prev_trace
-- prev_trace reads the lineage stored in '__trace:<field>' ('' when none).
local function prev_trace(key, field)
  return redis.call('HGET', key, '__trace:' .. field) or ''
end

-- helper: claim_one
-- claim_one decides one claim (claim.lua) of message id of group on stream
-- at the server time now (now_s: the same in decimal) and returns its reply as a table, or, for a claim
-- of a field without state that records nothing (the common case), only
-- the deadline_ms of reply 9, without a table. ARGV[first .. first+n-1]
-- are the message's other invocation fields to record (due, no attempt
-- used) unless they have state; complete writes __matched with them. A
-- probe, where a claim would take an attempt, records the field due now
-- with its attempts unchanged instead (reply 11).
--
-- A retained hash gets {7}, a message no longer in the group's PEL (in
-- the batch's pel set, else in_pel) {15}; nothing is written.
--
-- A claim costs one HMGET, its share of the batch's XPENDING and at most one HSET, and an HGET of the lineage
-- on the paths whose reply carries it: every redis.call, and every table,
-- costs the server more than the hash command it runs (bench/RESULTS.md,
-- section 1). Recorded fields are read and written CLAIM_CHUNK at a time,
-- within what unpack can put on the Lua stack.
local CLAIM_CHUNK = 1000
local function claim_one(key, stream, group, id, field, lease_ms, token, max_attempts, complete, probe, first, n, now, now_s, pel, gate, now_u)
  -- One read for the marker, the value and the fields to record.
  local last = first + n - 1
  local got
  if n == 0 then
    got = redis.call('HMGET', key, '__terminal', field)
  else
    got = redis.call('HMGET', key, '__terminal', field, unpack(ARGV, first, math.min(last, first + CLAIM_CHUNK - 1)))
  end
  if got[1] then
    return {7}
  elseif not (pel[id] or in_pel(stream, group, id)) then
    return {15}
  end
  for s = first + CLAIM_CHUNK, last, CLAIM_CHUNK do
    local more = redis.call('HMGET', key, unpack(ARGV, s, math.min(last, s + CLAIM_CHUNK - 1)))
    for j = 1, #more do
      got[s - first + 2 + j] = more[j]
    end
  end

  local v = got[2]
  if v and string.sub(v, -#token - 1) == ':' .. token then
    -- Only void.lua writes a claim's token before the claim runs: the
    -- worker gave this claim up for lost, so it records nothing.
    return {10}
  end
  if not v and n == 0 and not probe and not gate then
    -- The common case: no tables, one HSET.
    local deadline_ms = now + lease_ms
    local value = string.format('running:%d:1:%s', deadline_ms, token)
    if complete then
      redis.call('HSET', key, field, value, '__matched', '1')
    else
      redis.call('HSET', key, field, value)
    end
    return deadline_ms
  end

  -- w holds the field/value pairs to write, in one HSET at the end.
  local w, m = {}, 0
  if n > 0 then
    local due = 'next_attempt_at:' .. now_s .. ':0:' .. token
    for j = 1, n do
      if not got[j + 2] then
        w[m + 1], w[m + 2], m = ARGV[first + j - 1], due, m + 2
      end
    end
  end
  if complete then
    w[m + 1], w[m + 2], m = '__matched', '1', m + 2
  end

  local reply
  if not v and probe then
    -- Recorded due, no attempt used: the delivery cannot start it now.
    w[m + 1], w[m + 2], m = field, string.format('next_attempt_at:%d:0:%s', now, token), m + 2
    reply = {11, 0, 0}
  elseif not v then
    -- No state, so no lineage either: __trace:<field> is only written to a
    -- field that has state (the settle transitions).
    local deadline_ms = now + lease_ms
    if gate then
      reply = gate_pass(gate, id, 1, now, now_u, deadline_ms)
    end
    if not reply then
      w[m + 1], w[m + 2], m = field, string.format('running:%d:1:%s', deadline_ms, token), m + 2
      reply = {9, deadline_ms}
    elseif reply[1] == 14 then
      w[m + 1], w[m + 2], m = field, 'superseded:' .. reply[2], m + 2
    else
      -- Recorded due, as the record does, so a redelivery finds it.
      w[m + 1], w[m + 2], m = field, string.format('next_attempt_at:%d:0:%s', now, token), m + 2
    end
  elseif v == 'ok' then
    reply = {4}
  elseif string.sub(v, 1, 11) == 'superseded:' then
    reply = {14, string.sub(v, 12)}
  else
    -- executed: attempts used up by an expired lease (lost) or a due retry.
    local executed, lost
    local d, a = string.match(v, '^running:(%d+):(%d+):[^:]+$')
    if d then
      d = tonumber(d)
      if d > now then
        reply = {2, d, tonumber(a)}
      else
        executed = tonumber(a)
        lost = executed
      end
    else
      d, a = string.match(v, '^next_attempt_at:(%d+):(%d+):[^:]+$')
      if d then
        d = tonumber(d)
        if d > now then
          reply = {3, d, tonumber(a)}
        else
          executed, lost = tonumber(a), 0
        end
      end
    end
    if executed then
      local trace = prev_trace(key, field)
      if executed >= max_attempts then
        w[m + 1], w[m + 2], m = field, string.format('exhausted:%d:%s', executed, token), m + 2
        reply = {5, executed, token, trace, lost}
      elseif probe then
        -- Due, with the lost attempt (if any) charged and no new one taken.
        w[m + 1], w[m + 2], m = field, string.format('next_attempt_at:%d:%d:%s', now, executed, token), m + 2
        reply = {11, executed, lost}
      else
        local deadline_ms = now + lease_ms
        if gate then
          reply = gate_pass(gate, id, executed + 1, now, now_u, deadline_ms)
          if reply and reply[1] == 14 then
            w[m + 1], w[m + 2], m = field, 'superseded:' .. reply[2], m + 2
          end
          -- Otherwise deferred: the field stays as it is, a lost attempt
          -- uncharged until the claim that passes.
        end
        if not reply then
          w[m + 1], w[m + 2], m = field, string.format('running:%d:%d:%s', deadline_ms, executed + 1, token), m + 2
          reply = {1, executed + 1, deadline_ms, trace, lost}
        end
      end
    elseif not reply then
      local code, tok = 5
      a, tok = string.match(v, '^exhausted:(%d+):([^:]+)$')
      if not a then
        code = 6
        a, tok = string.match(v, '^exhausted:(%d+):([^:]+):dlq$')
      end
      if a then
        reply = {code, tonumber(a), tok, prev_trace(key, field)}
        if code == 5 then
          reply[5] = 0 -- none lost by this claim
        end
      else
        reply = {8, v}
      end
    end
  end

  for s = 1, m, 2 * CLAIM_CHUNK do
    redis.call('HSET', key, unpack(w, s, math.min(m, s + 2 * CLAIM_CHUNK - 1)))
  end
  return reply
end

-- helper: retain
-- retain applies the retention of a message that left the PEL to its hash
-- key (settle.lua, retain_acked.lua). With
-- ttl_ms '0' it deletes the hash and returns 1. Otherwise it sets
-- __terminal and a TTL of ttl_ms and returns 1; on a hash already retained
-- it changes nothing but a TTL removed from outside, put back (a running
-- TTL is never extended), and returns 4. A missing hash is not created
-- (nothing to keep: in_pel keeps a stale delivery inert without it), and 6
-- is returned.
local function retain(key, ttl_ms)
  if ttl_ms == '0' then
    redis.call('DEL', key)
    return 1
  end
  if redis.call('HEXISTS', key, '__terminal') == 1 then
    redis.call('PEXPIRE', key, ttl_ms, 'NX')
    return 4
  end
  if redis.call('EXISTS', key) == 0 then
    return 6
  end
  redis.call('HSET', key, '__terminal', '1')
  redis.call('PEXPIRE', key, ttl_ms)
  return 1
end
