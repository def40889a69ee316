-- publish_once.lua: append one entry at most once per idempotency key and
-- window (RedisStream.PublishOnce, docs/producing.md#idempotent-publish).
--
-- KEYS[1]  dedup key, keys.Idempotency(stream, key)
-- KEYS[2]  the stream
-- ARGV[1]  window: the dedup key's lifetime, ms (>= 1000)
-- ARGV[2..] the entry's field/value pairs, in pairs (at least one pair)
--
-- Returns {code, entry id}:
--   {1, id}  added: XADD wrote entry id, then the dedup key was set to it
--   {0, id}  duplicate: the dedup key exists; id is the entry it records,
--            and nothing was written (the window is not extended)
--
-- A script runs atomically, so concurrent publishers of one key are
-- serialised: the first adds, the others read its id. XADD runs before
-- SET: when XADD fails (say the stream key holds another type) the script
-- stops there, and no dedup key claims an entry that does not exist. Both
-- keys share a hash slot when the stream name has a hash tag.

local existing = redis.call('GET', KEYS[1])
if existing then
  return {0, existing}
end

local xadd = {'XADD', KEYS[2], '*'}
for i = 2, #ARGV do
  xadd[#xadd + 1] = ARGV[i]
end
local id = redis.call(unpack(xadd))
redis.call('SET', KEYS[1], id, 'PX', ARGV[1])
return {1, id}
