-- void.lua: give back a claim whose reply was lost (Store.Void). The
-- caller knows the claim's token but not whether its script ran, nor, so,
-- the attempt it claimed; the claim may also still be on its way (held in
-- a frozen network, behind this script).
--
-- KEYS[1]  invocation hash, keys.Invocation(stream, group, message id)
-- KEYS[2]  the stream (the same hash slot under Redis Cluster)
-- ARGV[1]  field, "<app>/<handler>"
-- ARGV[2]  token of the claim
-- ARGV[3]  consumer group
-- ARGV[4]  message id
--
-- What the field holds decides:
--   running:<deadline_ms>:<attempt>:<token>, this token: the claim ran and
--     nothing used it; released as settle.lua's release does, to
--     next_attempt_at:<now_ms>:<attempt-1>:<token>, due at once, uncharged
--   no value: the claim has not run; next_attempt_at:<now_ms>:0:<token>
--   next_attempt_at:<deadline_ms>:<attempt>:<other token>: the claim has
--     not run; the token becomes this one, due time and count unchanged
-- A claim that arrives later finds its own token in the value and changes
-- nothing (prelude.lua claim_one, reply 10), so it cannot record a lease
-- nobody uses. Any other value (this token already there, another
-- delivery's lease, "ok", exhausted) is left as it is.
--
-- Returns {code}:
--   {1}  given back, or the claim voided before it ran
--   {4}  nothing to do
--   {3}  terminal: __terminal is set, or the message is not in the
--        group's PEL; nothing changed
-- Idempotent: a second run finds this token and replies 4.

local key, field, token = KEYS[1], ARGV[1], ARGV[2]

local got = redis.call('HMGET', key, '__terminal', field)
if got[1] or not in_pel(KEYS[2], ARGV[3], ARGV[4]) then
  return {3}
end
local v = got[2]
if not v then
  redis.call('HSET', key, field, string.format('next_attempt_at:%d:0:%s', now_ms(), token))
  return {1}
end
local a, tok = string.match(v, RUNNING)
if a then
  if tok ~= token then
    return {4}
  end
  redis.call('HSET', key, field, string.format('next_attempt_at:%d:%d:%s', now_ms(), tonumber(a) - 1, token))
  return {1}
end
local d, n
d, n, tok = string.match(v, '^next_attempt_at:(%d+):(%d+):([^:]+)$')
if d and tok ~= token then
  redis.call('HSET', key, field, string.format('next_attempt_at:%s:%s:%s', d, n, token))
  return {1}
end
return {4}
