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
