package worker

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/schedule"
	"github.com/relaydev/relay/schedule/redisschedule"
)

// scheduleConfig is what the Scheduler of the apps' schedules is built
// from.
type scheduleConfig struct {
	redis    rueidis.Client
	stream   string // the first stream: occurrences are published there
	tracer   trace.TracerProvider
	stateDir string
	log      *slog.Logger
	observe  func(schedule.Spec, time.Time, redisschedule.Result)
	opts     []redisschedule.Option
}

// scheduler builds the Scheduler of every app's schedules, or nil when no
// app has a schedule.
func (c scheduleConfig) scheduler(apps *app.Set) (*redisschedule.Scheduler, error) {
	specs := apps.ScheduleSpecs()
	if len(specs) == 0 {
		return nil, nil
	}
	pub, err := redisschedule.NewPublisher(c.redis, c.stream, redisschedule.WithTracerProvider(c.tracer))
	if err != nil {
		return nil, fmt.Errorf("worker: schedules: %w", err)
	}
	opts := []redisschedule.Option{redisschedule.WithLogger(c.log), redisschedule.WithObserver(c.observe)}
	if c.stateDir != "" {
		opts = append(opts, redisschedule.WithStateDir(c.stateDir))
	}
	s, err := redisschedule.New(pub, specs, append(opts, c.opts...)...)
	if err != nil {
		return nil, fmt.Errorf("worker: schedules: %w", err)
	}
	return s, nil
}

// scheduleRunner runs the Scheduler of the current apps' schedules and
// replaces it when they change. A Scheduler that fails ends the worker:
// running without its schedules would silently drop occurrences.
type scheduleRunner struct {
	cfg  scheduleConfig
	fail func(error)

	cancel context.CancelFunc
	done   chan struct{}
}

// replace stops the running Scheduler, if any, and starts one for apps'
// schedules, if they have any. The outbox carries over: it lives in the
// state directory, not in the Scheduler.
func (s *scheduleRunner) replace(ctx context.Context, apps *app.Set) {
	s.stop()
	sched, err := s.cfg.scheduler(apps)
	if err != nil {
		s.fail(err)
		return
	}
	if sched == nil {
		return
	}
	sctx, cancel := context.WithCancel(ctx)
	s.cancel, s.done = cancel, make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		if err := sched.Run(sctx); err != nil && sctx.Err() == nil {
			s.fail(fmt.Errorf("schedules: %w", err))
		}
	}(s.done)
}

// stop stops the running Scheduler and waits for it.
func (s *scheduleRunner) stop() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
		s.cancel, s.done = nil, nil
	}
}

// sameSchedules reports whether a and b publish the same occurrences.
func sameSchedules(a, b *app.Set) bool {
	key := func(s schedule.Spec) string {
		return strings.Join([]string{s.App, s.Name, s.Handler, s.Cron.String(), s.Cron.Location().String()}, "\x00")
	}
	var ka, kb []string
	for _, s := range a.ScheduleSpecs() {
		ka = append(ka, key(s))
	}
	for _, s := range b.ScheduleSpecs() {
		kb = append(kb, key(s))
	}
	return slices.Equal(ka, kb)
}
