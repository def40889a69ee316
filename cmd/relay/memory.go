package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/worker"
)

// RetentionFlags are the retentions a memory projection assumes, read
// from the same settings as relay start's, so that an operator with the
// workers' environment sees the workers' projection.
type RetentionFlags struct {
	StreamRetention     time.Duration `name:"stream-retention" env:"REDIS_STREAM_RETENTION" default:"24h" help:"The workers' stream retention, for the memory projection (0: never trimmed)."`
	InvocationRetention time.Duration `name:"invocation-retention" env:"REDIS_INVOCATION_RETENTION" default:"48h" help:"The workers' invocation-state retention, for the memory projection (0: deleted with the acknowledgement)."`
	DLQRetention        `embed:""`
}

func (r RetentionFlags) retentions() stats.Retentions {
	// relay start trims at the worker's default interval.
	return stats.Retentions{Stream: r.StreamRetention, DLQ: r.Retention, Invocation: r.InvocationRetention,
		TrimInterval: worker.DefaultRetentionInterval}
}

func (r RetentionFlags) check() error {
	if r.StreamRetention < 0 || r.InvocationRetention < 0 {
		return usagef("--stream-retention and --invocation-retention must be >= 0, got %s and %s", r.StreamRetention, r.InvocationRetention)
	}
	return r.DLQRetention.check()
}

// measureMemory measures the stream's Redis memory with the retentions.
func (r RetentionFlags) measureMemory(ctx context.Context, rc rueidis.Client, g *Globals) (stats.Memory, error) {
	return redisstats.MeasureMemory(ctx, rc, g.RedisStream, g.RedisGroup, r.retentions(), stats.Budget{})
}

type memoryJSON struct {
	UsedBytes        int64          `json:"used_bytes"`
	MaxBytes         int64          `json:"maxmemory_bytes"`
	Stream           stats.Part     `json:"stream"`
	DLQ              stats.Part     `json:"dlq"`
	Invocations      stats.Part     `json:"invocation_state"`
	Other            stats.Part     `json:"other_relay_keys"`
	Sampled          bool           `json:"sampled"`
	EventsPerSecond  float64        `json:"events_per_second"`
	DLQPerSecond     float64        `json:"dead_letters_per_second"`
	MatchedShare     float64        `json:"matched_share"`
	Retentions       retentionsJSON `json:"retentions_seconds"`
	ProjectedBytes   int64          `json:"projected_bytes"`
	Unbounded        string         `json:"unbounded,omitempty"`
	OverBudget       bool           `json:"over_budget"`
	BudgetShareOfMax float64        `json:"budget_share_of_maxmemory"`
}

type retentionsJSON struct {
	Stream     float64 `json:"stream"`
	DLQ        float64 `json:"dlq"`
	Invocation float64 `json:"invocation"`
}

// memoryView is a measured Memory and the retentions it assumed.
type memoryView struct {
	m stats.Memory
	r stats.Retentions
}

func (v memoryView) json() *memoryJSON {
	return &memoryJSON{UsedBytes: v.m.Used, MaxBytes: v.m.Max,
		Stream: v.m.Stream, DLQ: v.m.DLQ, Invocations: v.m.Invocations, Other: v.m.Other,
		Sampled: v.m.Sampled, EventsPerSecond: v.m.Rate, DLQPerSecond: v.m.DLQRate, MatchedShare: v.m.MatchedShare,
		Retentions:     retentionsJSON{Stream: v.r.Stream.Seconds(), DLQ: v.r.DLQ.Seconds(), Invocation: v.r.Invocation.Seconds()},
		ProjectedBytes: v.m.Projected, Unbounded: v.m.Unbounded, OverBudget: v.m.Pressure(stats.BudgetShare), BudgetShareOfMax: stats.BudgetShare}
}

// write renders the memory table and the projection's verdict.
func (v memoryView) write(w io.Writer) error {
	m, r := v.m, v.r
	row := func(name string, p stats.Part, kept string) []string {
		items := strconv.FormatInt(p.Items, 10)
		if m.Sampled && (name == "invocation state" || name == "other relay keys") {
			items = "~" + items
		}
		return []string{name, stats.FormatBytes(p.Bytes), items, stats.FormatBytes(int64(p.PerItem)), kept, projectedText(p.Projected)}
	}
	fmt.Fprintf(w, "\nRedis memory: %s used, %s; %.2f events/s (%.4f dead letters/s), %.0f%% matched\n\n",
		stats.FormatBytes(m.Used), maxText(m.Max), m.Rate, m.DLQRate, 100*m.MatchedShare)
	err := table(w, []string{"PART", "NOW", "ITEMS", "PER ITEM", "KEPT FOR", "AT THIS RATE"}, [][]string{
		row("source stream", m.Stream, retentionText(r.Stream, "forever")),
		row("dead-letter stream", m.DLQ, retentionText(r.DLQ, "forever")),
		row("invocation state", m.Invocations, retentionText(r.Invocation, "0 (deleted at ack)")),
		row("other relay keys", m.Other, "-"),
	})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, "\n"+v.verdict())
	return err
}

// verdict is one sentence on the projection against maxmemory.
func (v memoryView) verdict() string { return v.m.Verdict(stats.BudgetShare) }

// retentionText is d, or zero when d is 0.
func retentionText(d time.Duration, zero string) string {
	if d > 0 {
		return d.String()
	}
	return zero
}

func projectedText(n int64) string {
	if n < 0 {
		return "unbounded"
	}
	return stats.FormatBytes(n)
}

func maxText(n int64) string {
	if n <= 0 {
		return "no maxmemory"
	}
	return "maxmemory " + stats.FormatBytes(n)
}
