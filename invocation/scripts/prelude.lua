-- prelude.lua: helpers that scripts.go prepends to every transition script
-- (Redis scripts cannot load one another). It defines functions only.

-- now_ms returns the Redis server clock in Unix milliseconds, so worker
-- clock skew cannot change outcomes.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Patterns of fenced values; captures are attempt, token and (for
-- EXHAUSTED) the rest of the value.
local RUNNING = '^running:%d+:(%d+):([^:]+)$'
local EXHAUSTED = '^exhausted:(%d+):([^:]+)(.*)$'

-- fence checks that the hash is not retained and that field matches
-- pattern with this attempt and token. It returns 0, the stored value and
-- the third capture when it does; otherwise the reply code, 3 (terminal)
-- or 2 (stale).
local function fence(key, field, pattern, attempt, token)
  if redis.call('HEXISTS', key, '__terminal') == 1 then
    return 3
  end
  local v = redis.call('HGET', key, field)
  if not v then
    return 2
  end
  local a, tok, rest = string.match(v, pattern)
  if not a or tonumber(a) ~= attempt or tok ~= token then
    return 2
  end
  return 0, v, rest
end

-- Trace lineage: the reserved field '__trace:<field>' holds an opaque trace
-- reference (a W3C traceparent) of the latest attempt of field that ended
-- without success, so the next attempt, on any worker, can link to it.
-- trace_field names it; save_trace writes it unless trace is empty, and
-- prev_trace reads it ('' when none).
local function trace_field(field)
  return '__trace:' .. field
end

local function save_trace(key, field, trace)
  if trace and trace ~= '' then
    redis.call('HSET', key, trace_field(field), trace)
  end
end

local function prev_trace(key, field)
  return redis.call('HGET', key, trace_field(field)) or ''
end

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
