// Package stats keeps the cluster-wide delivery counters of one stream and
// consumer group in Redis, the numbers relay stats shows
// (docs/delivery.md#cluster-wide-counters), a sampled feed of recent
// invocation outcomes that relay console tails, and each worker's status:
// why it holds messages pending (WriteStatus, ReadHolds;
// docs/delivery.md#held-messages), the attempts it runs, its slots and
// whether it created the consumer group again, and what of that stalls
// the stream (Stalls, Recreations; docs/delivery.md#worker-status).
//
// Every worker counts in memory (Recorder.Add never waits for Redis or
// fails) and adds its counts to one hash every second (Recorder.Flush);
// Read returns the sums. Like the Prometheus counters they count
// deliveries and attempts, so a redelivered message is received again. The
// hash is a wire contract: its field names do not change.
//
// A Recorder is safe for concurrent use; the package starts no goroutines.
// It never closes the client it is given.
package stats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
)

// DefaultFlushInterval is how often a worker adds what it counted to the
// hash.
const DefaultFlushInterval = time.Second

// Counts are the cluster-wide counters of one stream and consumer group.
type Counts struct {
	// Received counts delivered stream entries.
	Received int64
	// Matched, Unmatched and Malformed classify them.
	Matched, Unmatched, Malformed int64
	// Successes and Failures count handler attempts that ran: Failures are
	// the ones that exited non-zero, timed out or were killed, and the ones
	// lost with their worker (charged when their lease expired). Attempts
	// that could not run (app unavailable, runtime down) count in neither.
	Successes, Failures int64
	// Retries counts failed attempts scheduled for another try, lost ones
	// (charged when their lease expired) included.
	Retries int64
	// DLQEntries counts dead-letter entries written.
	DLQEntries int64
	// Replays and ReplayFailures count the dead-letter replays of relay
	// console: replays whose handler succeeded (the entry was deleted),
	// and replays that failed or were refused (the entry was kept). They
	// are not deliveries, so no other counter counts them.
	Replays, ReplayFailures int64
}

// Counter names one of the counters.
type Counter int

// The counters, in the order of Counts.
const (
	Received Counter = iota
	Matched
	Unmatched
	Malformed
	Successes
	Failures
	Retries
	DLQEntries
	Replays
	ReplayFailures
	numCounters
)

// fields are the field names of the hash, a wire contract read by relay
// stats on any worker's version.
var fields = [numCounters]string{
	Received:   "received",
	Matched:    "matched",
	Unmatched:  "unmatched",
	Malformed:  "malformed",
	Successes:  "successes",
	Failures:   "failures",
	Retries:    "retries",
	DLQEntries: "dlq_entries",
	// Added later: a reader that does not know them ignores them.
	Replays:        "replays",
	ReplayFailures: "replay_failures",
}

func (c *Counts) field(n Counter) *int64 {
	return [numCounters]*int64{
		&c.Received, &c.Matched, &c.Unmatched, &c.Malformed,
		&c.Successes, &c.Failures, &c.Retries, &c.DLQEntries,
		&c.Replays, &c.ReplayFailures,
	}[n]
}

// Read returns the counters of stream and group. A counter nobody has
// added to yet is 0; a field that is not an integer is an error naming it.
func Read(ctx context.Context, client rueidis.Client, stream, group string) (Counts, error) {
	key := keys.Stats(stream, group)
	m, err := client.Do(ctx, client.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		return Counts{}, fmt.Errorf("read stats %s: %w", key, err)
	}
	var c Counts
	for n, name := range fields {
		v, ok := m[name]
		if !ok {
			continue
		}
		i, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Counts{}, fmt.Errorf("read stats %s: field %q is not an integer: %q", key, name, v)
		}
		*c.field(Counter(n)) = i
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
	counts  [numCounters]atomic.Int64
	feed    feedBuffer
}

// NewRecorder returns a Recorder of stream and group's counters.
func NewRecorder(client rueidis.Client, stream, group string) *Recorder {
	return &Recorder{client: client, key: keys.Stats(stream, group), feedKey: keys.Feed(stream, group)}
}

// Add counts one more of c.
func (r *Recorder) Add(c Counter) {
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
	var taken []Counter
	var deltas []int64
	cmds := make(rueidis.Commands, 0, numCounters)
	for c := range numCounters {
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
