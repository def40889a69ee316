package redisstream

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// pruneScript removes the consumers of a group that hold nothing pending
// and have been idle for at least a given time, in one step, so a consumer
// that claims or reads meanwhile cannot lose an entry: XGROUP DELCONSUMER
// drops the consumer's pending entries with it, and there are none.
//
// KEYS[1] the stream; ARGV[1] the group; ARGV[2] min idle, ms; ARGV[3] a
// consumer never removed (the caller's own). Returns the removed names;
// an error reply when the stream or group does not exist.
var pruneScript = rueidis.NewLuaScriptRetryable(`
local removed = {}
for _, flat in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local c = {}
  for i = 1, #flat, 2 do
    c[flat[i]] = flat[i + 1]
  end
  if c['name'] ~= ARGV[3] and tonumber(c['pending']) == 0 and tonumber(c['idle']) >= tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], c['name'])
    table.insert(removed, c['name'])
  end
end
return removed
`)

// PruneConsumers removes from the Source's group every consumer other than
// its own that has nothing pending and has been idle (no read or claim)
// for at least minIdle (docs/operations.md#retention): a worker that
// restarts under a new name (a new pod's hostname) leaves its old
// consumer behind, and the group's list of consumers would grow with every
// restart. A removed consumer that turns out to be alive is created again
// by its next read. It returns the names removed; a missing stream or
// group is an error wrapping stream.ErrNoStream or stream.ErrNoGroup, minIdle <= 0 an
// error.
func (s *Source) PruneConsumers(ctx context.Context, minIdle time.Duration) ([]string, error) {
	if minIdle <= 0 {
		return nil, fmt.Errorf("stream: prune consumers of %s: min idle must be > 0, got %s", s.stream, minIdle)
	}
	removed, err := pruneScript.Exec(ctx, s.client, []string{s.stream},
		[]string{s.group, strconv.FormatInt(minIdle.Milliseconds(), 10), s.consumer}).AsStrSlice()
	if err != nil {
		return nil, s.wrap("prune consumers", err)
	}
	return removed, nil
}
