-- trim.lua: trim the source stream to its retention, never past the safe
-- floor of its consumer groups (Source.Trim). Safe to run any number of
-- times, by any number of workers at once.
--
-- KEYS[1]  the source stream
-- ARGV[1]  retention, ms (>= 1)
-- ARGV[2]  the Source's consumer group
-- ARGV[3]  limit: the most entries the node pass removes (>= 1000)
--
-- The cutoff is the server's TIME minus the retention: entries with a
-- smaller millisecond time are due. The floor is the smallest, over EVERY
-- consumer group of the stream, of the group's oldest pending id
-- (XPENDING <stream> <group> - + 1, read only when XINFO GROUPS reports
-- entries pending) and its last-delivered-id (what follows it is not
-- delivered yet; the last delivered entry itself is kept too). The trim
-- removes the entries below both (XTRIM MINID): first whole nodes
-- (MINID ~ ... LIMIT), then, unless that pass may have stopped at its
-- limit, the rest exactly, which then lies within a single node.
--
-- Returns:
--   {1, trimmed, now_ms, minid, floor, floor_group, floor_pending, more, next}
--        floor_pending is 1 when floor is floor_group's oldest pending id,
--        0 when it is its last-delivered-id; more is 1 when the node pass
--        may have stopped at the limit with due entries left; next is,
--        when floor is a last-delivered-id, the id of the entry after it
--        ('' when there is none, or when floor is pending): whether the
--        group holds back anything besides the entry it stands on
--   {2}  the stream does not exist: nothing trimmed
--   {3}  the Source's group does not exist: nothing trimmed

local key = KEYS[1]
local retention = tonumber(ARGV[1])
local own = ARGV[2]
local limit = tonumber(ARGV[3])

if redis.call('EXISTS', key) == 0 then
  return {2}
end

-- Stream ids are "<ms>-<seq>", two unsigned 64-bit decimals without
-- leading zeros, which Lua numbers (doubles) cannot all hold: compare the
-- digit strings by length, then lexically.
local function num_less(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

local function id_less(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if am ~= bm then
    return num_less(am, bm)
  end
  return num_less(as, bs)
end

-- XINFO GROUPS replies one flat name/value array per group, in name order.
local floor, floor_group, floor_pending = nil, '', 0
local found = false
for _, flat in ipairs(redis.call('XINFO', 'GROUPS', key)) do
  local g = {}
  for i = 1, #flat, 2 do
    g[flat[i]] = flat[i + 1]
  end
  if g['name'] == own then
    found = true
  end
  local held, pending = g['last-delivered-id'], 0
  if tonumber(g['pending']) > 0 then
    local first = redis.call('XPENDING', key, g['name'], '-', '+', 1)[1]
    if first and id_less(first[1], held) then
      held, pending = first[1], 1
    end
  end
  if floor == nil or id_less(held, floor) then
    floor, floor_group, floor_pending = held, g['name'], pending
  end
end
if not found then
  return {3}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now - retention
local function next_after()
  if floor_pending == 1 then
    return ''
  end
  local e = redis.call('XRANGE', key, '(' .. floor, '+', 'COUNT', 1)[1]
  if e then
    return e[1]
  end
  return ''
end
if cutoff <= 0 then
  return {1, 0, now, '0-0', floor, floor_group, floor_pending, 0, next_after()}
end
local minid = string.format('%d', cutoff) .. '-0'
if id_less(floor, minid) then
  minid = floor
end

local trimmed = redis.call('XTRIM', key, 'MINID', '~', minid, 'LIMIT', limit)
local more = 0
if trimmed > limit / 2 then
  -- The node pass may have stopped at its limit (a node holds far fewer
  -- entries than limit/2): leave the rest to the next call.
  more = 1
else
  trimmed = trimmed + redis.call('XTRIM', key, 'MINID', minid)
end
return {1, trimmed, now, minid, floor, floor_group, floor_pending, more, next_after()}
