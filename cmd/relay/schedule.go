package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/schedule"
)

// scheduleCounters are the schedule metrics of reference.md
// "Observability"; every worker publishes, so the sum over workers of
// published is the number of occurrences.
type scheduleCounters struct {
	published, duplicate prometheus.Counter
}

func newScheduleCounters(reg prometheus.Registerer) (*scheduleCounters, error) {
	c := &scheduleCounters{
		published: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Name: "schedule_occurrences_published_total",
			Help: "Schedule occurrences this worker wrote to the stream."}),
		duplicate: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Name: "schedule_occurrences_duplicate_total",
			Help: "Schedule occurrences this worker found already published (by another worker or an earlier run)."}),
	}
	for _, m := range []prometheus.Collector{c.published, c.duplicate} {
		if err := reg.Register(m); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *scheduleCounters) observe(_ schedule.Spec, _ time.Time, r schedule.Result) {
	switch r {
	case schedule.Published:
		c.published.Inc()
	case schedule.Duplicate:
		c.duplicate.Inc()
	}
}

// scheduler builds the Scheduler of every app's schedules, publishing into
// stream (the first of REDIS_STREAM), with its outbox under the state
// directory. It returns nil when no app has a schedule.
func (c *StartCmd) scheduler(apps *relay.Apps, rc rueidis.Client, stream string, log *slog.Logger, reg prometheus.Registerer) (*schedule.Scheduler, error) {
	specs := relay.ScheduleSpecs(apps)
	if len(specs) == 0 {
		return nil, nil
	}
	counters, err := newScheduleCounters(reg)
	if err != nil {
		return nil, err
	}
	pub, err := schedule.NewPublisher(rc, stream)
	if err != nil {
		return nil, err
	}
	return schedule.New(pub, specs,
		schedule.WithStateDir(c.StateDir),
		schedule.WithLogger(log),
		schedule.WithObserver(counters.observe),
	)
}

// runWithScheduler runs the engines and, beside them, s (when not nil).
// A Scheduler that fails ends the worker: running without its schedules
// would silently drop occurrences.
func runWithScheduler(ctx context.Context, s *schedule.Scheduler, engines []*relay.Engine) error {
	if s == nil {
		return runEngines(ctx, engines)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	serr := make(chan error, 1)
	go func() {
		err := s.Run(ctx)
		if err != nil && !errors.Is(err, context.Canceled) {
			stop()
			err = fmt.Errorf("schedules: %w", err)
		} else {
			err = nil
		}
		serr <- err
	}()
	eerr := runEngines(ctx, engines)
	stop()
	return errors.Join(<-serr, eerr)
}
