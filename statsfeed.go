package relay

import (
	"context"
	"log/slog"

	"github.com/relaydev/relay/internal/ctxtime"
)

// statsLoop flushes the counts every stats interval until ctx is done; Run
// flushes once more after the last message finished. A failure is logged on
// its first occurrence and every 30th after that, never returned.
func (e *Engine) statsLoop(ctx context.Context) {
	if e.cfg.Stats == nil {
		return
	}
	var fails ctxtime.Failures
	ctxtime.Every(ctx, e.cfg.StatsInterval, func() {
		// Not under ctx: a stop cancelling a flush whose HINCRBYs Redis
		// already applied would put the counts back, and the final flush
		// would add them twice.
		err := e.cfg.Stats.Flush(e.writeCtx(ctx))
		if n, report := fails.Note(err); report && ctx.Err() == nil {
			e.log.LogAttrs(ctx, slog.LevelWarn, "writing stats failed; the counts are kept and written later",
				slog.Int("failures", n), slog.Any("error", err))
		}
	})
}

// flushStats writes what is left at shutdown, under a detached context.
func (e *Engine) flushStats(ctx context.Context) {
	if e.cfg.Stats == nil {
		return
	}
	if err := e.cfg.Stats.Flush(e.writeCtx(ctx)); err != nil {
		e.log.LogAttrs(ctx, slog.LevelWarn, "writing stats at shutdown failed; these counts are lost", slog.Any("error", err))
	}
}
