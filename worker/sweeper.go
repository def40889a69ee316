package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/ctxtime"
)

// sweeper has a relay.Sweeper runner remove leftovers at start and every
// interval: a container whose removal failed while its runtime was down
// would otherwise run on past its timeout.
type sweeper struct {
	runner   relay.Sweeper
	interval time.Duration
	log      *slog.Logger
}

// Run sweeps now and every interval until ctx ends.
func (s *sweeper) Run(ctx context.Context) {
	sweep := func() {
		if err := s.runner.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.LogAttrs(ctx, slog.LevelWarn, "sweeping leftovers failed", slog.Any("error", err))
		}
	}
	sweep()
	ctxtime.Every(ctx, s.interval, sweep)
}
