package redisdlq

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/stream"
)

// replayTimeLayout is the layout of a history's last_at: RFC 3339 in UTC
// with milliseconds, as an entry's timestamp.
const replayTimeLayout = "2006-01-02T15:04:05.000Z07:00"

// maxReplayError bounds the last error a history keeps, in bytes.
const maxReplayError = 4 << 10

// Replay hash fields (keys.DLQReplays; docs/console.md#pages).
const (
	replaysCount  = "count"
	replaysAt     = "last_at"
	replaysResult = "last_result"
	replaysError  = "last_error"
)

// RecordReplay adds a replay of entry id that did not succeed to its
// history (keys.DLQReplays: a hash beside the DLQ stream, in its hash
// slot), and returns the history. ttl is how long the history outlives
// this replay, the DLQ retention (retention trims the entry by then); 0
// keeps it until Delete. The history of an id the stream does not hold is
// written all the same: the caller has just replayed it.
func (s *Store) RecordReplay(ctx context.Context, id string, at time.Time, result, errText string, ttl time.Duration) (dlq.Replays, error) {
	if !stream.IsID(id) {
		return dlq.Replays{}, fmt.Errorf("%w: %q is not a stream id", dlq.ErrNotFound, id)
	}
	if len(errText) > maxReplayError {
		errText = errText[:maxReplayError] + "…"
	}
	key := keys.DLQReplays(s.stream, id)
	b := s.client.B()
	cmds := rueidis.Commands{
		b.Hincrby().Key(key).Field(replaysCount).Increment(1).Build(),
		b.Hset().Key(key).FieldValue().FieldValue(replaysAt, at.UTC().Format(replayTimeLayout)).
			FieldValue(replaysResult, result).FieldValue(replaysError, errText).Build(),
	}
	if ttl > 0 {
		cmds = append(cmds, b.Pexpire().Key(key).Milliseconds(ttl.Milliseconds()).Build())
	}
	res := s.client.DoMulti(ctx, cmds...)
	for _, r := range res {
		if err := r.Error(); err != nil {
			return dlq.Replays{}, fmt.Errorf("dlq: record a replay of %s: %w", id, err)
		}
	}
	n, _ := res[0].AsInt64()
	return dlq.Replays{Count: n, LastAt: at.UTC().Truncate(time.Millisecond), LastResult: result, LastError: errText}, nil
}

// Replays returns the replay history of entry id, zero when it has none.
func (s *Store) Replays(ctx context.Context, id string) (dlq.Replays, error) {
	m, err := s.client.Do(ctx, s.client.B().Hgetall().Key(keys.DLQReplays(s.stream, id)).Build()).AsStrMap()
	if err != nil {
		return dlq.Replays{}, fmt.Errorf("dlq: replays of %s: %w", id, err)
	}
	return decodeReplays(m), nil
}

// ReplaysOf returns the replay history of each of ids, in one round trip.
func (s *Store) ReplaysOf(ctx context.Context, ids []string) ([]dlq.Replays, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make(rueidis.Commands, len(ids))
	for i, id := range ids {
		cmds[i] = s.client.B().Hgetall().Key(keys.DLQReplays(s.stream, id)).Build()
	}
	out := make([]dlq.Replays, len(ids))
	for i, r := range s.client.DoMulti(ctx, cmds...) {
		m, err := r.AsStrMap()
		if err != nil {
			return nil, fmt.Errorf("dlq: replays of %s: %w", ids[i], err)
		}
		out[i] = decodeReplays(m)
	}
	return out, nil
}

func decodeReplays(m map[string]string) dlq.Replays {
	var r dlq.Replays
	r.Count, _ = strconv.ParseInt(m[replaysCount], 10, 64)
	if t, err := time.Parse(time.RFC3339Nano, m[replaysAt]); err == nil {
		r.LastAt = t.UTC()
	}
	r.LastResult, r.LastError = m[replaysResult], m[replaysError]
	return r
}
