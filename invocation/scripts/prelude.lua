-- prelude.lua: helpers that scripts.go puts in front of the transition
-- scripts that use them (Redis scripts cannot load one another). Every
-- helper is one block that starts with a "-- helper: <name>" line; a script
-- gets the blocks whose names it mentions, and those the blocks mention. A
-- script runs its whole chunk on every call, so helpers it does not use
-- would cost it time on each one.

-- helper: now_ms
-- now_ms returns the Redis server clock in Unix milliseconds, so worker
-- clock skew cannot change outcomes.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- helper: RUNNING
-- The pattern of a running value; captures are attempt and token.
local RUNNING = '^running:%d+:(%d+):([^:]+)$'

-- helper: EXHAUSTED
-- The pattern of an exhausted value; captures are attempt, token and the
-- rest of the value (':dlq' once the entry is written).
local EXHAUSTED = '^exhausted:(%d+):([^:]+)(.*)$'

-- helper: fence
-- fence checks that the hash is not retained and that field matches
-- pattern with this attempt and token, in one HMGET. It returns 0, the
-- stored value and the third capture when it does; otherwise the reply
-- code, 3 (terminal) or 2 (stale).
local function fence(key, field, pattern, attempt, token)
  local got = redis.call('HMGET', key, '__terminal', field)
  if got[1] then
    return 3
  end
  local v = got[2]
  if not v then
    return 2
  end
  local a, tok, rest = string.match(v, pattern)
  if not a or tonumber(a) ~= attempt or tok ~= token then
    return 2
  end
  return 0, v, rest
end

-- helper: claim_one
-- claim_one decides one claim (claim.lua) at the server time now and
-- returns its reply. rec lists the message's other invocation fields to
-- record (due, no attempt used) unless they have state; complete writes
-- __matched with them.
local function claim_one(key, field, lease_ms, token, max_attempts, complete, rec, now)
  -- One read for the marker, the value and the lineage.
  local got = redis.call('HMGET', key, '__terminal', field, '__trace:' .. field)
  if got[1] then
    return {7}
  end
  local trace = got[3] or ''

  for _, f in ipairs(rec) do
    redis.call('HSETNX', key, f, string.format('next_attempt_at:%d:0:%s', now, token))
  end

  local function start(attempt, lost)
    local deadline_ms = now + lease_ms
    local value = string.format('running:%d:%d:%s', deadline_ms, attempt, token)
    if complete then
      redis.call('HSET', key, field, value, '__matched', '1')
    else
      redis.call('HSET', key, field, value)
    end
    return {1, attempt, deadline_ms, trace, lost}
  end

  -- mark writes __matched on the paths that do not claim.
  local function mark()
    if complete then
      redis.call('HSET', key, '__matched', '1')
    end
  end

  -- executed attempts are used up; start the next one or exhaust.
  local function next_after(executed, lost)
    if executed >= max_attempts then
      redis.call('HSET', key, field, string.format('exhausted:%d:%s', executed, token))
      mark()
      return {5, executed, token, trace, lost}
    end
    return start(executed + 1, lost)
  end

  local v = got[2]
  if not v then
    return start(1, 0)
  end
  mark()
  if v == 'ok' then
    return {4}
  end

  local d, a = string.match(v, '^running:(%d+):(%d+):[^:]+$')
  if d then
    d = tonumber(d)
    if d > now then
      return {2, d}
    end
    return next_after(tonumber(a), tonumber(a))
  end

  d, a = string.match(v, '^next_attempt_at:(%d+):(%d+):[^:]+$')
  if d then
    d = tonumber(d)
    if d > now then
      return {3, d}
    end
    return next_after(tonumber(a), 0)
  end

  local tok
  a, tok = string.match(v, '^exhausted:(%d+):([^:]+)$')
  if a then
    return {5, tonumber(a), tok, trace}
  end
  a, tok = string.match(v, '^exhausted:(%d+):([^:]+):dlq$')
  if a then
    return {6, tonumber(a), tok, trace}
  end

  return {8, v}
end

-- helper: save_trace
-- Trace lineage: the reserved field '__trace:<field>' holds an opaque trace
-- reference (a W3C traceparent) of the latest attempt of field that ended
-- without success, so the next attempt, on any worker, can link to it.
-- save_trace writes it unless trace is empty.
local function save_trace(key, field, trace)
  if trace and trace ~= '' then
    redis.call('HSET', key, '__trace:' .. field, trace)
  end
end

-- helper: prev_trace
-- prev_trace reads the lineage save_trace wrote ('' when none).
local function prev_trace(key, field)
  return redis.call('HGET', key, '__trace:' .. field) or ''
end

-- helper: retain
-- retain switches key to terminal retention (retain.lua, retain_acked.lua):
-- it sets __terminal and a TTL of ttl_ms, creating the hash if it is
-- missing, and returns 1. On a hash already retained it changes nothing
-- but a TTL removed from outside, put back (a running TTL is never
-- extended), and returns 4.
local function retain(key, ttl_ms)
  if redis.call('HEXISTS', key, '__terminal') == 1 then
    redis.call('PEXPIRE', key, ttl_ms, 'NX')
    return 4
  end
  redis.call('HSET', key, '__terminal', '1')
  redis.call('PEXPIRE', key, ttl_ms)
  return 1
end
