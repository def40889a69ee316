-- claim.lua: decide whether a delivery may run a new attempt of one
-- invocation field and, if so, record the claim (Store.Claim).
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- ARGV[1]  field, "<app>/<handler>"
-- ARGV[2]  lease, ms (>= 1): a new attempt runs until now + lease
-- ARGV[3]  token for this claim (hex, no ':')
-- ARGV[4]  max attempts (>= 1): the rule's retries + 1
-- ARGV[5]  optional, on a message's first delivery: '1' when the fields
--          recorded are every invocation the message has, '0' when not
-- ARGV[6…] optional: the message's other invocation fields, recorded as
--          next_attempt_at:<now>:0:<token> (due, no attempt used) unless
--          they have state; with ARGV[5] '1', __matched is set to '1'
--
-- Recording the message's invocations at its first delivery is what lets a
-- redelivery run exactly those, even when it would no longer match some of
-- them (a now() cutoff passed, a template changed) and when the worker died
-- before claiming them.
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
-- Only code 1, code 5 when it follows an expired lease or a due retry, and
-- the recording of ARGV[5…] write; no path touches the TTL.

local key, field, token = KEYS[1], ARGV[1], ARGV[3]
local lease_ms = tonumber(ARGV[2])
local max_attempts = tonumber(ARGV[4])

-- One read for the marker, the value and the lineage.
local got = redis.call('HMGET', key, '__terminal', field, '__trace:' .. field)
if got[1] then
  return {7}
end
local trace = got[3] or ''

local now = now_ms()

-- matched is written with the claim's own HSET when there is one.
local matched = ARGV[5] == '1'
for i = 6, #ARGV do
  redis.call('HSETNX', key, ARGV[i], string.format('next_attempt_at:%d:0:%s', now, token))
end

local function start(attempt, lost)
  local deadline_ms = now + lease_ms
  local value = string.format('running:%d:%d:%s', deadline_ms, attempt, token)
  if matched then
    redis.call('HSET', key, field, value, '__matched', '1')
  else
    redis.call('HSET', key, field, value)
  end
  return {1, attempt, deadline_ms, trace, lost}
end

-- mark writes __matched on the paths that do not claim.
local function mark()
  if matched then
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
