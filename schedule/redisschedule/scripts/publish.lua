-- publish.lua: publish one schedule occurrence at most once (Publisher.Publish,
-- docs/schedules.md#one-occurrence-however-many-workers).
--
-- KEYS[1]  dedup key, keys.ScheduleOccurrence(stream, app, schedule, at)
-- KEYS[2]  the stream the occurrence goes to
-- ARGV[1]  dedup key lifetime, ms (>= 1)
-- ARGV[2]  envelope JSON, written as the entry's "event" field
-- ARGV[3..] optional further field/value pairs of the entry, in pairs
--           (traceparent, tracestate)
--
-- Returns {code, entry id}:
--   {1, id}  published: XADD wrote entry id, then the dedup key was set to it
--   {0, id}  duplicate: the dedup key exists; id is the entry it records
--
-- XADD runs before SET: when XADD fails (say the stream key holds another
-- type), the script stops there and no dedup key claims an entry that does
-- not exist. Both keys share a hash slot when the stream name has a hash tag.

local existing = redis.call('GET', KEYS[1])
if existing then
  return {0, existing}
end

local xadd = {'XADD', KEYS[2], '*', 'event', ARGV[2]}
for i = 3, #ARGV do
  xadd[#xadd + 1] = ARGV[i]
end
local id = redis.call(unpack(xadd))
redis.call('SET', KEYS[1], id, 'PX', ARGV[1])
return {1, id}
