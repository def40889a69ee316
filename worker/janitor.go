package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/invocation/redisstate"
)

// janitorPass is how long one pass of the janitor over a node's keys may
// take: a hash leaked in the ack-to-retain window gets its retention within
// about this long.
const janitorPass = time.Hour

// janitor gives terminal retention (or, with a ttl of 0, deletion) to one
// stream's invocation state left without a TTL after its message was
// acknowledged (a worker that died
// between the XACK and the switch to retention), one bounded SCAN step
// every interval (docs/delivery.md#invocation-state). A step is sized from
// the node's key count so that a pass over it takes about an hour.
type janitor struct {
	interval, ttl time.Duration
	state         *redisstate.Store
	stream, group string
	log           *slog.Logger
	retained      prometheus.Counter
}

// Run takes a step every interval until ctx ends.
func (j *janitor) Run(ctx context.Context) {
	var cursor uint64
	count := redisstate.DefaultLeakScanCount
	ctxtime.Every(ctx, j.interval, func() {
		res, err := j.state.RetainLeaked(ctx, j.stream, j.group, cursor, count, j.ttl)
		if err != nil {
			if ctx.Err() == nil {
				j.log.LogAttrs(ctx, slog.LevelWarn, "scanning for leaked invocation state failed; retrying", slog.Any("error", err))
			}
			return
		}
		cursor = res.Cursor
		j.retained.Add(float64(res.Retained))
		if res.Retained > 0 {
			msg := "retained invocation state left without a TTL after its message was acknowledged"
			if j.ttl == 0 {
				msg = "deleted invocation state left behind after its message was acknowledged"
			}
			j.log.LogAttrs(ctx, slog.LevelInfo, msg, slog.Int("hashes", res.Retained))
		}
		steps := int64(janitorPass / j.interval)
		count = max(redisstate.DefaultLeakScanCount, int(res.Keys/max(steps, 1))+1)
	})
}
