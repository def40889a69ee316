package worker

import (
	"context"
	"log/slog"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

// memoryWatch measures one stream's Redis memory and its projection at
// the worker's retentions every interval (redisstats.MeasureMemory), exports
// them as gauges, and warns when the projection is over stats.BudgetShare
// of maxmemory: once, and again only when the verdict changes (back under
// budget, or another part is to blame).
type memoryWatch struct {
	interval      time.Duration
	redis         rueidis.Client
	stream, group string
	retentions    stats.Retentions
	log           *slog.Logger
	projected     prometheus.Gauge
	maxmemory     prometheus.Gauge
	used          prometheus.Gauge
	// over is the part the last measurement blamed, "" when under budget,
	// and overNow whether it was for the memory in use now rather than
	// the projection. Confined to Run's goroutine.
	over    string
	overNow bool
	// failing counts the measurements in a row that failed.
	failing int
}

// memoryRetentions are c's retentions as a projection reads them: a
// disabled stream retention keeps every entry (0 in stats.Retentions).
func memoryRetentions(c Config) stats.Retentions {
	return stats.Retentions{Stream: max(c.StreamRetention, 0), DLQ: max(c.DLQRetention, 0), Invocation: c.stateRetention(),
		TrimInterval: c.RetentionInterval}
}

// Run measures now and every interval until ctx ends.
func (m *memoryWatch) Run(ctx context.Context) {
	m.check(ctx)
	ctxtime.Every(ctx, m.interval, func() { m.check(ctx) })
}

// check measures once, sets the gauges and logs a change of verdict. The
// first of failed measurements in a row (a user without +memory or +info,
// Redis down) is logged at warn level, the others at debug: nothing else
// says that a user without +memory is never measured, and the gauges then
// stay as if there were no maxmemory. The first success after them is
// logged at info.
func (m *memoryWatch) check(ctx context.Context) {
	mem, err := redisstats.MeasureMemory(ctx, m.redis, m.stream, m.group, m.retentions, stats.Budget{})
	if err != nil {
		if ctx.Err() == nil {
			level := slog.LevelDebug
			if m.failing == 0 {
				level = slog.LevelWarn
			}
			m.failing++
			m.log.LogAttrs(ctx, level, "cannot measure Redis memory; relay_redis_memory_projected_bytes and relay_redis_maxmemory_bytes are not updated (the user needs +memory and +info, docs/operations.md#memory-budget)",
				slog.Any("error", err))
		}
		return
	}
	if m.failing > 0 {
		m.log.LogAttrs(ctx, slog.LevelInfo, "measures Redis memory again", slog.Int("failures", m.failing))
		m.failing = 0
	}
	projected := float64(mem.Projected)
	if mem.Projected < 0 {
		projected = math.Inf(1)
	}
	m.projected.Set(projected)
	m.maxmemory.Set(float64(mem.Max))
	m.used.Set(float64(mem.Used))
	m.judge(ctx, mem)
}

// budgetHysteresis is how far under the budget share a Redis that was
// over it must come before the worker says it is back under: one that
// hovers at the limit warns once, not at every measurement that crosses
// it.
const budgetHysteresis = 0.05

// judge logs a change of verdict on mem: a warning naming the part to
// change when it goes over budget (or another part is to blame), an info
// line when it is back under, with budgetHysteresis of margin.
func (m *memoryWatch) judge(ctx context.Context, mem stats.Memory) {
	over, change, now := "", "", false
	if mem.Pressure(stats.BudgetShare) {
		over, change = mem.Blame(stats.BudgetShare)
		now = !mem.ProjectedOver(stats.BudgetShare)
	} else if m.over != "" && mem.Pressure(stats.BudgetShare-budgetHysteresis) {
		return // still close to the limit: the warning stands
	}
	if over == m.over && now == m.overNow {
		return
	}
	was := m.over
	m.over, m.overNow = over, now
	if over == "" {
		m.log.LogAttrs(ctx, slog.LevelInfo, "projected Redis memory is back under budget",
			slog.Int64("projected_bytes", mem.Projected), slog.Int64("maxmemory_bytes", mem.Max), slog.String("was", was))
		return
	}
	attrs := []slog.Attr{
		slog.String("part", over), slog.String("change", change),
		slog.Int64("projected_bytes", mem.Projected), slog.Int64("maxmemory_bytes", mem.Max),
		slog.Int64("used_bytes", mem.Used), slog.Float64("events_per_second", mem.Rate),
	}
	msg := "projected Redis memory is over 90% of maxmemory; at maxmemory Relay stops (docs/operations.md#memory-budget)"
	if now {
		msg = "Redis memory in use is over 90% of maxmemory now; at maxmemory Relay stops (docs/operations.md#memory-budget)"
	}
	m.log.LogAttrs(ctx, slog.LevelWarn, msg, attrs...)
}
