package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/relaydev/relay/internal/reltime"
	"github.com/relaydev/relay/stats"

	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// StatsCmd is `relay stats`.
type StatsCmd struct {
	JSON           bool `name:"json" help:"Print JSON instead of a table."`
	RetentionFlags `embed:""`
}

// Help shows examples under relay stats --help.
func (c *StatsCmd) Help() string {
	return `Counters are cluster-wide: every worker of the stream and group adds to them in Redis, from when it first ran. received counts deliveries, so a redelivered message counts again; successes and failures count handler attempts. pending and the age of the oldest pending entry come from XPENDING, dead-letter entries now from the DLQ stream.

Then the memory budget: the Redis memory of the stream, the dead-letter stream, the invocation state and the other relay: keys, the event rate, and the memory they peak at (just before a trim, the workers trimming every minute) if that rate goes on with the retentions given (set --stream-retention, --invocation-retention and --dlq-retention, or their variables, as the workers have them), against 90% of maxmemory (docs/operations.md#memory-budget). Needs +memory|usage and +info in the Redis user's ACL.

Examples:

    relay stats
    relay stats --json | jq .pending`
}

type statsJSON struct {
	Stream           string  `json:"stream"`
	Group            string  `json:"group"`
	Received         int64   `json:"received"`
	Matched          int64   `json:"matched"`
	Unmatched        int64   `json:"unmatched"`
	Malformed        int64   `json:"malformed"`
	Successes        int64   `json:"successes"`
	Failures         int64   `json:"failures"`
	Retries          int64   `json:"retries"`
	DLQEntries       int64   `json:"dlq_entries"`
	Superseded       int64   `json:"superseded"`
	DLQLength        int64   `json:"dlq_length"`
	Pending          int64   `json:"pending"`
	OldestPendingAge float64 `json:"oldest_pending_age_seconds"`
	OldestPendingAt  string  `json:"oldest_pending_at,omitempty"`
	// Holds says why live workers hold messages pending
	// (docs/delivery.md#held-messages); empty when nothing is held.
	Holds []stats.Hold `json:"holds"`
	// Waiting are the invocations live workers keep waiting for their
	// rules' flow control, by rule and limit
	// (docs/flow-control.md#waiting); empty when none waits.
	Waiting []stats.Waiting `json:"waiting"`
	// Memory is nil when it could not be measured; MemoryError says why.
	Memory      *memoryJSON `json:"memory"`
	MemoryError string      `json:"memory_error,omitempty"`
}

// Run prints the cluster-wide counters, the PEL summary and the DLQ length.
func (c *StatsCmd) Run(ctx context.Context, g *Globals) error {
	if err := g.requireStream(true); err != nil {
		return err
	}
	if err := c.RetentionFlags.check(); err != nil {
		return err
	}
	rc, err := g.streamClient(ctx)
	if err != nil {
		return err
	}
	defer rc.Close()
	s, err := redisstats.Read(ctx, rc, g.RedisStream, g.RedisGroup)
	if err != nil {
		return err
	}
	pending, oldest, err := redisstream.New(rc, g.RedisStream, g.RedisGroup, "relay-stats").Pending(ctx)
	if errors.Is(err, stream.ErrNoGroup) {
		return fmt.Errorf("consumer group %q does not exist on stream %q: check REDIS_GROUP (--group)", g.RedisGroup, g.RedisStream)
	}
	if err != nil {
		return err
	}
	dlqLen, err := redisdlq.NewStore(rc, g.RedisStream).Len(ctx)
	if err != nil {
		return err
	}
	workers, err := redisstats.ReadStatus(ctx, rc, g.RedisStream, g.RedisGroup, time.Now())
	if err != nil {
		return err
	}
	holds, waiting := stats.Holds(workers), stats.SumWaiting(workers)
	// Memory is measured last and may be refused (an ACL user without
	// +memory or +info): the counters are still worth printing.
	mem, memErr := c.measureMemory(ctx, rc, g)
	view := memoryView{m: mem, r: c.retentions()}
	if c.JSON {
		out := statsJSON{Stream: g.RedisStream, Group: g.RedisGroup, Received: s.Received, Matched: s.Matched,
			Unmatched: s.Unmatched, Malformed: s.Malformed, Successes: s.Successes, Failures: s.Failures,
			Retries: s.Retries, DLQEntries: s.DLQEntries, Superseded: s.Superseded, DLQLength: dlqLen, Pending: pending, OldestPendingAge: oldest.Seconds(),
			Holds: append([]stats.Hold{}, holds...), Waiting: append([]stats.Waiting{}, waiting...)}
		if pending > 0 {
			out.OldestPendingAt = time.Now().Add(-oldest).UTC().Format(time.RFC3339)
		}
		if memErr != nil {
			out.MemoryError = memErr.Error()
		} else {
			out.Memory = view.json()
		}
		return writeJSON(g.stdout, out)
	}
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	oldestText := "-"
	if pending > 0 {
		oldestText = reltime.Age(oldest)
	}
	fmt.Fprintf(g.stdout, "Stream %s, group %s\n\n", g.RedisStream, g.RedisGroup)
	err = table(g.stdout, []string{"COUNTER", "VALUE"}, [][]string{
		{"received", n(s.Received)},
		{"matched", n(s.Matched)},
		{"unmatched", n(s.Unmatched)},
		{"malformed", n(s.Malformed)},
		{"successes", n(s.Successes)},
		{"failures", n(s.Failures)},
		{"retries", n(s.Retries)},
		{"dlq entries written", n(s.DLQEntries)},
		{"dlq entries now", n(dlqLen)},
		{"superseded", n(s.Superseded)},
		{"pending", n(pending)},
		{"oldest pending age", oldestText},
	})
	if err != nil {
		return err
	}
	if err := writeHolds(g.stdout, holds); err != nil {
		return err
	}
	if err := writeWaiting(g.stdout, waiting, time.Now()); err != nil {
		return err
	}
	if memErr != nil {
		_, err = fmt.Fprintf(g.stdout, "\nRedis memory: not measured: %v\n", memErr)
		return err
	}
	return view.write(g.stdout)
}

// writeWaiting prints the invocations workers keep waiting for their
// rules' flow control, when any waits.
func writeWaiting(w io.Writer, waiting []stats.Waiting, now time.Time) error {
	if len(waiting) == 0 {
		return nil
	}
	if _, err := fmt.Fprintln(w, "\nWaiting for flow control (docs/flow-control.md#waiting):"); err != nil {
		return err
	}
	rows := make([][]string, 0, len(waiting))
	for _, v := range waiting {
		oldest := "-"
		if !v.Oldest.IsZero() {
			oldest = reltime.Age(now.Sub(v.Oldest))
		}
		rows = append(rows, []string{v.App + "/" + v.Handler, v.Limit, strconv.Itoa(v.Count), oldest})
	}
	return table(w, []string{"RULE", "LIMIT", "WAITING", "OLDEST EVENT"}, rows)
}

// writeHolds prints why workers hold messages pending, when they do.
func writeHolds(w io.Writer, holds []stats.Hold) error {
	if len(holds) == 0 {
		return nil
	}
	if _, err := fmt.Fprintf(w, "\nHELD: messages stay pending until these are fixed\n"); err != nil {
		return err
	}
	rows := make([][]string, len(holds))
	for i, h := range holds {
		n := strconv.Itoa(h.Held)
		if h.AtLeast {
			n = ">=" + n
		}
		rows[i] = []string{cmp.Or(h.App, "-"), h.Reason, n, h.Error}
	}
	return table(w, []string{"APP", "REASON", "HELD", "ERROR"}, rows)
}
