package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
)

// DefaultStatsInterval is how often an Engine adds what it counted to the
// cluster-wide counters in Redis (WithStats).
const DefaultStatsInterval = time.Second

// Stats are the cluster-wide counters every worker of one stream and
// consumer group adds to (relay stats). Like the Prometheus counters of
// reference.md "Observability", they count deliveries and attempts: a
// redelivered message is received (and matched) again.
type Stats struct {
	// Received counts delivered stream entries.
	Received int64
	// Matched, Unmatched and Malformed classify them.
	Matched, Unmatched, Malformed int64
	// Successes and Failures count handler attempts that ran: Failures are
	// the ones that exited non-zero or timed out, and the ones lost with
	// their worker (charged when their lease expired). Attempts that could
	// not run (app unavailable, runtime down) count in neither.
	Successes, Failures int64
	// Retries counts failed attempts scheduled for another try.
	Retries int64
	// DLQEntries counts dead-letter entries written.
	DLQEntries int64
}

// counter indexes one field of the stats hash.
type counter int

const (
	countReceived counter = iota
	countMatched
	countUnmatched
	countMalformed
	countSuccesses
	countFailures
	countRetries
	countDLQEntries
	numCounters
)

// statsFields are the field names of the stats hash, a wire contract read
// by relay stats on any worker's version.
var statsFields = [numCounters]string{
	countReceived:   "received",
	countMatched:    "matched",
	countUnmatched:  "unmatched",
	countMalformed:  "malformed",
	countSuccesses:  "successes",
	countFailures:   "failures",
	countRetries:    "retries",
	countDLQEntries: "dlq_entries",
}

func (s *Stats) field(c counter) *int64 {
	return [numCounters]*int64{
		&s.Received, &s.Matched, &s.Unmatched, &s.Malformed,
		&s.Successes, &s.Failures, &s.Retries, &s.DLQEntries,
	}[c]
}

// ReadStats returns the counters of stream and group from the hash
// keys.Stats(stream, group). A counter nobody has added to yet is 0; a
// field that is not an integer is an error naming it.
func ReadStats(ctx context.Context, client rueidis.Client, stream, group string) (Stats, error) {
	key := keys.Stats(stream, group)
	m, err := client.Do(ctx, client.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		return Stats{}, fmt.Errorf("read stats %s: %w", key, err)
	}
	var s Stats
	for c, name := range statsFields {
		v, ok := m[name]
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Stats{}, fmt.Errorf("read stats %s: field %q is not an integer: %q", key, name, v)
		}
		*s.field(counter(c)) = n
	}
	return s, nil
}

// statsRecorder counts in memory and adds the counts to the stats hash from
// the Engine's stats loop, so counting never waits for Redis nor fails a
// message. Counts that could not be written are kept for the next flush. A
// nil *statsRecorder counts nothing. Safe for concurrent use.
type statsRecorder struct {
	client rueidis.Client
	key    string
	counts [numCounters]atomic.Int64
}

// newStatsRecorder returns nil when client is nil (stats are off).
func newStatsRecorder(client rueidis.Client, stream, group string) *statsRecorder {
	if client == nil {
		return nil
	}
	return &statsRecorder{client: client, key: keys.Stats(stream, group)}
}

func (r *statsRecorder) add(c counter) {
	if r != nil {
		r.counts[c].Add(1)
	}
}

// flush adds the counts taken so far to the hash (one HINCRBY per non-zero
// counter, pipelined). A counter whose HINCRBY failed is put back. A reply
// lost after Redis applied it can count twice: these are statistics.
func (r *statsRecorder) flush(ctx context.Context) error {
	if r == nil {
		return nil
	}
	var taken []counter
	var deltas []int64
	cmds := make(rueidis.Commands, 0, numCounters)
	for c := range numCounters {
		if n := r.counts[c].Swap(0); n != 0 {
			taken = append(taken, c)
			deltas = append(deltas, n)
			cmds = append(cmds, r.client.B().Hincrby().Key(r.key).Field(statsFields[c]).Increment(n).Build())
		}
	}
	if len(cmds) == 0 {
		return nil
	}
	var errs []error
	for i, res := range r.client.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			r.counts[taken[i]].Add(deltas[i])
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("write stats %s: %w", r.key, errors.Join(errs...))
	}
	return nil
}

// statsLoop flushes the counts every stats interval until ctx is done; Run
// flushes once more after the last message finished. A failure is logged on
// its first occurrence and every 30th after that, never returned.
func (e *Engine) statsLoop(ctx context.Context) {
	if e.stats == nil {
		return
	}
	var fails int
	every(ctx, e.o.statsInterval, func() {
		// Not under ctx: a stop cancelling a flush whose HINCRBYs Redis
		// already applied would put the counts back, and the final flush
		// would add them twice.
		octx, cancel := detached(ctx)
		err := e.stats.flush(octx)
		cancel()
		switch {
		case err == nil:
			fails = 0
		case ctx.Err() != nil:
		default:
			if fails%30 == 0 {
				e.log.LogAttrs(ctx, slog.LevelWarn, "writing stats failed; the counts are kept and written later",
					slog.Int("failures", fails+1), slog.Any("error", err))
			}
			fails++
		}
	})
}

// flushStats writes what is left at shutdown, under a detached context.
func (e *Engine) flushStats(ctx context.Context) {
	if e.stats == nil {
		return
	}
	octx, cancel := detached(ctx)
	defer cancel()
	if err := e.stats.flush(octx); err != nil {
		e.log.LogAttrs(ctx, slog.LevelWarn, "writing stats at shutdown failed; these counts are lost", slog.Any("error", err))
	}
}
