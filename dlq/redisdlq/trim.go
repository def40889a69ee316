package redisdlq

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
)

// trimLimit is the most entries one Trim removes as whole stream nodes
// before it leaves the rest to the next call (about a millisecond of
// server time on Redis 7.0).
const trimLimit = 100_000

// Trim removes the dead-letter entries older than retention, by the time
// in their ids (the Redis server's clock when they were written) against
// the server's TIME now, in one script (docs/operations.md#retention).
// It is by age only: consumer groups an operator created on the
// dead-letter stream are not consulted. Whole stream nodes go first, at
// most an internal bound of entries per call, then the expired entries
// left in the boundary node; a call that may have stopped at the bound
// reports More. Safe to run from many workers at once.
//
// retention 0 keeps entries forever: Trim returns a zero dlq.TrimResult
// without calling Redis; a negative retention is an error. A missing
// dead-letter stream is not an error (nothing to trim).
func (w *Writer) Trim(ctx context.Context, retention time.Duration) (dlq.TrimResult, error) {
	return w.trim(ctx, retention, trimLimit)
}

func (w *Writer) trim(ctx context.Context, retention time.Duration, limit int) (dlq.TrimResult, error) {
	switch {
	case retention == 0:
		return dlq.TrimResult{}, nil
	case retention < time.Millisecond:
		return dlq.TrimResult{}, fmt.Errorf("dlq: trim %s: retention must be 0 (keep forever) or >= 1ms, got %s", w.key, retention)
	}
	args := []string{strconv.FormatInt(retention.Milliseconds(), 10), strconv.Itoa(limit)}
	reply, err := trimScript.Exec(ctx, w.client, []string{w.key}, args).AsIntSlice()
	if err != nil {
		return dlq.TrimResult{}, fmt.Errorf("dlq: trim %s: %w", w.key, err)
	}
	if len(reply) != 3 {
		return dlq.TrimResult{}, fmt.Errorf("dlq: trim %s: script reply has %d elements, want 3", w.key, len(reply))
	}
	return dlq.TrimResult{
		Trimmed: reply[0],
		Cutoff:  time.UnixMilli(reply[1] - retention.Milliseconds()),
		More:    reply[2] == 1,
	}, nil
}

// trimScript removes the entries of the dead-letter stream older than the
// retention (Writer.Trim). Retryable: a repeat removes what is due then.
//
// KEYS[1] the DLQ stream
// ARGV[1] retention in ms (>= 1), ARGV[2] limit of the node pass
// Returns {trimmed, now_ms, more}: more is 1 when the node pass may have
// stopped at the limit (a node holds far fewer than limit/2 entries), and
// then the exact pass is left to the next call.
var trimScript = rueidis.NewLuaScriptRetryable(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now - tonumber(ARGV[1])
if cutoff <= 0 then
  return {0, now, 0}
end
local minid = string.format('%d', cutoff) .. '-0'
local limit = tonumber(ARGV[2])
local n = redis.call('XTRIM', KEYS[1], 'MINID', '~', minid, 'LIMIT', limit)
if n > limit / 2 then
  return {n, now, 1}
end
return {n + redis.call('XTRIM', KEYS[1], 'MINID', minid), now, 0}
`)
