package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/relaydev/relay/internal/ctxtime"
)

// statsFeed flushes the cluster-wide counts every interval until ctx is
// done; Run flushes once more after the last message finished. A failure
// is logged on its first occurrence and every 30th after that, never
// returned.
type statsFeed struct {
	stats    Stats
	p        *pipeline
	interval time.Duration
}

func (f *statsFeed) run(ctx context.Context) {
	var fails ctxtime.Failures
	ctxtime.Every(ctx, f.interval, func() {
		// Not under ctx: a stop cancelling a flush whose HINCRBYs Redis
		// already applied would put the counts back, and the final flush
		// would add them twice.
		err := f.stats.Flush(f.p.writeCtx(ctx))
		if n, report := fails.Note(err); report && ctx.Err() == nil {
			f.p.log.LogAttrs(ctx, slog.LevelWarn, "writing stats failed; the counts are kept and written later",
				slog.Int("failures", n), slog.Any("error", err))
		}
	})
}

// flush writes what is left at shutdown, under a detached context.
func (f *statsFeed) flush(ctx context.Context) {
	if err := f.stats.Flush(f.p.writeCtx(ctx)); err != nil {
		f.p.log.LogAttrs(ctx, slog.LevelWarn, "writing stats at shutdown failed; these counts are lost", slog.Any("error", err))
	}
}
