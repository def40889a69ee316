-- claim.lua: decide whether a delivery may run a new attempt of one
-- invocation field and, if so, record the claim (Store.Claim).
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- ARGV[1]  field, "<app>/<handler>"
-- ARGV[2]  lease, ms (>= 1): a new attempt runs until now + lease
-- ARGV[3]  token for this claim (hex, no ':')
-- ARGV[4]  max attempts (>= 1): the rule's retries + 1
--
-- now is the server's TIME in Unix ms. An attempt that was claimed and whose
-- lease expired counts as executed and failed. When the next attempt would
-- exceed max attempts, the field becomes exhausted:<attempt>:<token> instead.
--
-- Returns {code, ...}:
--   {1, attempt, deadline_ms, trace, lost}  claimed: field = running:<deadline_ms>:<attempt>:<token>
--   {2, deadline_ms}                  running: a live lease of another delivery
--   {3, deadline_ms}                  not due: next attempt allowed at deadline_ms
--   {4}                               succeeded ("ok")
--   {5, attempt, token, trace[, lost]} exhausted, DLQ entry not recorded yet
--   {6, attempt, token, trace}        exhausted, DLQ entry recorded (":dlq")
--   {7}                               terminal: __terminal is set
--   {8, value}                        the stored value is malformed
-- trace is the lineage of the latest attempt that stored one in
-- __trace:<field> (release, schedule_retry, exhaust), '' when none. lost is
-- the attempt whose expired lease this claim charged (its worker died
-- mid-run), 0 when none: counted once, by the claim that saw it.
-- Only code 1, and code 5 when it follows an expired lease or a due retry,
-- write; no path touches the TTL.

local key, field, token = KEYS[1], ARGV[1], ARGV[3]
local lease_ms = tonumber(ARGV[2])
local max_attempts = tonumber(ARGV[4])

if redis.call('HEXISTS', key, '__terminal') == 1 then
  return {7}
end

local now = now_ms()

local function start(attempt, lost)
  local deadline_ms = now + lease_ms
  redis.call('HSET', key, field, string.format('running:%d:%d:%s', deadline_ms, attempt, token))
  return {1, attempt, deadline_ms, prev_trace(key, field), lost}
end

-- executed attempts are used up; start the next one or exhaust.
local function next_after(executed, lost)
  if executed >= max_attempts then
    redis.call('HSET', key, field, string.format('exhausted:%d:%s', executed, token))
    return {5, executed, token, prev_trace(key, field), lost}
  end
  return start(executed + 1, lost)
end

local v = redis.call('HGET', key, field)
if not v then
  return start(1, 0)
end
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
  return {5, tonumber(a), tok, prev_trace(key, field)}
end
a, tok = string.match(v, '^exhausted:(%d+):([^:]+):dlq$')
if a then
  return {6, tonumber(a), tok, prev_trace(key, field)}
end

return {8, v}
