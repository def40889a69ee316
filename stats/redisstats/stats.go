package redisstats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/stats"
)

// fields are the field names of the hash, a wire contract read by relay
// stats on any worker's version.
var fields = [stats.NumCounters]string{
	stats.Received:   "received",
	stats.Matched:    "matched",
	stats.Unmatched:  "unmatched",
	stats.Malformed:  "malformed",
	stats.Successes:  "successes",
	stats.Failures:   "failures",
	stats.Retries:    "retries",
	stats.DLQEntries: "dlq_entries",
	// Added later: a reader that does not know them ignores them.
	stats.Replays:        "replays",
	stats.ReplayFailures: "replay_failures",
	stats.Superseded:     "superseded",
}

// counter is the field of c that counts n.
func counter(c *stats.Counts, n stats.Counter) *int64 {
	return [stats.NumCounters]*int64{
		&c.Received, &c.Matched, &c.Unmatched, &c.Malformed,
		&c.Successes, &c.Failures, &c.Retries, &c.DLQEntries,
		&c.Replays, &c.ReplayFailures, &c.Superseded,
	}[n]
}

// Read returns the counters of stream and group. A counter nobody has
// added to yet is 0; a field that is not an integer is an error naming it.
func Read(ctx context.Context, client rueidis.Client, stream, group string) (stats.Counts, error) {
	key := keys.Stats(stream, group)
	m, err := client.Do(ctx, client.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		return stats.Counts{}, fmt.Errorf("read stats %s: %w", key, err)
	}
	var c stats.Counts
	for n, name := range fields {
		v, ok := m[name]
		if !ok {
			continue
		}
		i, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return stats.Counts{}, fmt.Errorf("read stats %s: field %q is not an integer: %q", key, name, v)
		}
		*counter(&c, stats.Counter(n)) = i
	}
	return c, nil
}

// Recorder counts in memory and adds the counts to the hash of one stream
// and group when flushed, so counting never waits for Redis nor fails a
// message. Counts that could not be written are kept for the next flush.
// A nil *Recorder counts nothing.
type Recorder struct {
	client  rueidis.Client
	key     string
	feedKey string
	counts  [stats.NumCounters]atomic.Int64
	feed    feedBuffer
}

// NewRecorder returns a Recorder of stream and group's counters.
func NewRecorder(client rueidis.Client, stream, group string) *Recorder {
	return &Recorder{client: client, key: keys.Stats(stream, group), feedKey: keys.Feed(stream, group)}
}

// Add counts one more of c.
func (r *Recorder) Add(c stats.Counter) {
	if r != nil {
		r.counts[c].Add(1)
	}
}

// Flush adds the counts taken so far to the hash (one HINCRBY per non-zero
// counter) and the events recorded to the feed, in one pipelined round
// trip. A counter whose HINCRBY failed is put back; feed events are not
// retried. A reply lost after Redis applied it can count twice: these are
// statistics. Run it under a context that a stop does not cancel mid-call,
// or counts that Redis applied are put back and added twice.
func (r *Recorder) Flush(ctx context.Context) error {
	if r == nil {
		return nil
	}
	var taken []stats.Counter
	var deltas []int64
	cmds := make(rueidis.Commands, 0, stats.NumCounters)
	for c := range stats.NumCounters {
		if n := r.counts[c].Swap(0); n != 0 {
			taken = append(taken, c)
			deltas = append(deltas, n)
			cmds = append(cmds, r.client.B().Hincrby().Key(r.key).Field(fields[c]).Increment(n).Build())
		}
	}
	counted := len(cmds)
	cmds = append(cmds, r.takeFeed()...)
	if len(cmds) == 0 {
		return nil
	}
	var errs []error
	for i, res := range r.client.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			if i < counted {
				r.counts[taken[i]].Add(deltas[i])
			}
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("write stats %s: %w", r.key, errors.Join(errs...))
	}
	return nil
}
