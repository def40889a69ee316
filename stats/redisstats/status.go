package redisstats

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/stats"
)

// statusTTL expires the whole hash once no worker writes it.
const statusTTL = 10 * time.Minute

// WriteStatus publishes s as s.Consumer's field of stream and group's
// status hash and keeps the hash from expiring.
func WriteStatus(ctx context.Context, client rueidis.Client, stream, group string, s stats.WorkerStatus) error {
	key := keys.Status(stream, group)
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("write status %s: %w", key, err)
	}
	for _, res := range client.DoMulti(ctx,
		client.B().Hset().Key(key).FieldValue().FieldValue(s.Consumer, string(b)).Build(),
		client.B().Pexpire().Key(key).Milliseconds(statusTTL.Milliseconds()).Build()) {
		if err := res.Error(); err != nil {
			return fmt.Errorf("write status %s: %w", key, err)
		}
	}
	return nil
}

// ClearStatus removes consumer's status: a worker that stops holds nothing.
func ClearStatus(ctx context.Context, client rueidis.Client, stream, group, consumer string) error {
	key := keys.Status(stream, group)
	if err := client.Do(ctx, client.B().Hdel().Key(key).Field(consumer).Build()).Error(); err != nil {
		return fmt.Errorf("clear status %s: %w", key, err)
	}
	return nil
}

// ReadStatus returns the status of every worker of stream and group that
// wrote it within stats.StatusStaleAfter of now, by consumer name. A field
// that is not a status is skipped: one broken writer must not hide the
// others.
func ReadStatus(ctx context.Context, client rueidis.Client, stream, group string, now time.Time) ([]stats.WorkerStatus, error) {
	key := keys.Status(stream, group)
	m, err := client.Do(ctx, client.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("read status %s: %w", key, err)
	}
	var out []stats.WorkerStatus
	for consumer, v := range m {
		var s stats.WorkerStatus
		if json.Unmarshal([]byte(v), &s) != nil || now.Sub(s.UpdatedAt) > stats.StatusStaleAfter {
			continue
		}
		s.Consumer = consumer
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b stats.WorkerStatus) int { return cmp.Compare(a.Consumer, b.Consumer) })
	return out, nil
}

// ReadHolds is ReadStatus merged by stats.Holds.
func ReadHolds(ctx context.Context, client rueidis.Client, stream, group string) ([]stats.Hold, error) {
	ws, err := ReadStatus(ctx, client, stream, group, time.Now())
	return stats.Holds(ws), err
}
