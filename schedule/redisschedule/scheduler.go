package redisschedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/schedule"
)

// Scheduler publishes the occurrences of a fixed set of schedules when they
// fall due (docs/schedules.md#one-occurrence-however-many-workers). Every
// worker runs one over every schedule; the Publisher's dedup key makes each
// occurrence one stream entry however many workers publish it.
//
// Time: an occurrence is due when the authoritative clock (the Redis
// server's TIME, see WithNow) reaches its instant. The Scheduler keeps the
// offset between that clock and its local clock, sleeps on the local clock
// until the next instant looks due, and reads the server clock again before
// publishing. When the server clock cannot be read, it goes on with the
// local clock and the last offset, so occurrences still reach the outbox
// while Redis is down.
//
// Failures: a publish is retried after each wait of WithPublishBackoff; an
// occurrence that still fails goes to the outbox (durable with
// WithStateDir), which Run retries at start and every WithOutboxInterval
// until each occurrence is published or found already published.
//
// The set of schedules is fixed: to change it, stop Run and start a new
// Scheduler (it may share the state directory). A Scheduler is safe for
// concurrent use, but Run runs once at a time.
type Scheduler struct {
	pub    *Publisher
	tracer trace.Tracer
	specs  []schedule.Spec
	byName map[[2]string]schedule.Spec // (app, name) → spec, for outbox records
	o      options
	log    *slog.Logger
	outbox *outbox

	running atomic.Bool

	// Owned by the Run goroutine.
	offset    time.Duration // authoritative clock minus local clock
	clockDown bool          // the last read of the authoritative clock failed
}

// New returns a Scheduler that publishes the occurrences of specs through
// pub. Every spec must have App, Name, Handler and a Cron (cron.Parse),
// and (App, Name) must be unique. An empty list is
// allowed: Run then only retries the outbox until its context ends.
func New(pub *Publisher, specs []schedule.Spec, opts ...Option) (*Scheduler, error) {
	if pub == nil {
		return nil, errors.New("schedule: New: nil Publisher")
	}
	o := defaultOptions(forScheduler)
	if err := o.apply(opts); err != nil {
		return nil, fmt.Errorf("schedule: New: %w", err)
	}
	s := &Scheduler{pub: pub, o: o, byName: make(map[[2]string]schedule.Spec, len(specs)), outbox: newOutbox(o.stateDir)}
	s.tracer = pub.tracer
	if o.tracerProvider != nil {
		s.tracer = newTracer(o.tracerProvider)
	}
	s.log = o.logger
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.o.clock == nil {
		s.o.clock = time.Now
	}
	if s.o.now == nil {
		s.o.now = pub.ServerTime
	}
	for i, sp := range specs {
		if sp.App == "" || sp.Name == "" || sp.Handler == "" {
			return nil, fmt.Errorf("schedule: New: spec %d (%s/%s): app, name and handler must not be empty", i, sp.App, sp.Name)
		}
		k := [2]string{sp.App, sp.Name}
		if _, dup := s.byName[k]; dup {
			return nil, fmt.Errorf("schedule: New: schedule %s/%s is listed twice", sp.App, sp.Name)
		}
		if sp.Cron == nil {
			return nil, fmt.Errorf("schedule: New: schedule %s/%s has no Cron", sp.App, sp.Name)
		}
		s.byName[k] = sp
		s.specs = append(s.specs, sp)
	}
	return s, nil
}

// Result is what became of one occurrence, as reported to WithObserver.
type Result int

const (
	// Published: this call wrote the occurrence to the stream.
	Published Result = iota + 1
	// Duplicate: the occurrence was already published (by another worker,
	// an earlier run, or catch-up); nothing was written.
	Duplicate
	// Outboxed: publishing failed after every retry; the occurrence was
	// stored in the outbox and will be retried until published.
	Outboxed
	// Failed: publishing failed and the occurrence could not be stored in
	// the outbox either (see the log). It is lost unless another worker
	// publishes it.
	Failed
)

func (r Result) String() string {
	switch r {
	case Published:
		return "published"
	case Duplicate:
		return "duplicate"
	case Outboxed:
		return "outboxed"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// occurrence is one firing of one schedule.
type occurrence struct {
	spec schedule.Spec
	at   time.Time
}

func (s *Scheduler) attrs(oc occurrence, more ...slog.Attr) []slog.Attr {
	return append([]slog.Attr{
		slog.String(telemetry.App, oc.spec.App),
		slog.String(attrSchedule, oc.spec.Name),
		slog.String(attrScheduledAt, schedule.FormatAt(oc.at)),
	}, more...)
}

// Run publishes occurrences until ctx ends, then returns nil. At start it
// prepares the outbox (an unusable state directory is an error naming it),
// retries the outbox, and publishes each schedule's latest firing within the
// catch-up window
// (docs/schedules.md#missed-occurrences-and-daylight-saving-time); that
// occurrence is usually a duplicate already published by a running worker. It
// returns ErrRunning when called while already running.
//
// An occurrence being retried when ctx ends goes to the outbox, so a
// shutdown does not lose it.
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer s.running.Store(false)
	if err := s.outbox.open(s.o.stateDir); err != nil {
		return err
	}
	if !s.outbox.durable() {
		s.log.LogAttrs(ctx, slog.LevelInfo, "schedule outbox is in memory; occurrences that fail to publish are lost at exit")
	}

	if ctx.Err() != nil {
		return nil
	}
	next := s.catchUp(ctx)

	ticker := time.NewTicker(s.o.outboxInterval)
	defer ticker.Stop()
	for {
		if ctx.Err() != nil {
			return nil
		}
		due := earliest(next)
		wait := s.o.maxSleep
		if !due.IsZero() {
			if left := due.Sub(s.o.clock().Add(s.offset)); left < wait {
				wait = left
			}
		}
		if wait > 0 {
			if !s.pause(ctx, wait, ticker.C) {
				return nil
			}
			continue
		}
		// Due by the local estimate; the authoritative clock decides.
		now := s.serverNow(ctx)
		if early := due.Sub(now); early > 0 {
			// The local estimate ran ahead of the server; sleep the
			// difference rather than ask the server again at once.
			if !s.pause(ctx, min(early, s.o.maxSleep), ticker.C) {
				return nil
			}
			continue
		}
		s.publishAll(ctx, s.dueBatch(ctx, next, now))
	}
}

// catchUp retries the outbox, publishes per schedule the latest firing
// within the catch-up window and returns each schedule's first firing
// after now, in s.specs order.
func (s *Scheduler) catchUp(ctx context.Context) []time.Time {
	now := s.serverNow(ctx)
	s.drain(ctx)
	next := make([]time.Time, len(s.specs))
	var catchUp []occurrence
	for i, oc := range s.specs {
		if at, ok, err := oc.Latest(now, s.o.catchUpWindow); err != nil {
			s.specError(ctx, oc, err)
		} else if ok {
			catchUp = append(catchUp, occurrence{oc, at})
		}
		next[i] = s.nextAfter(ctx, oc, now)
	}
	if len(catchUp) > 0 {
		s.log.LogAttrs(ctx, slog.LevelInfo, "schedule catch-up", slog.Int("occurrences", len(catchUp)), slog.Duration("window", s.o.catchUpWindow))
		s.publishAll(ctx, catchUp)
	}
	return next
}

// dueBatch returns the occurrences due at now and moves each of their
// schedules' next firing (next, in s.specs order) past now.
func (s *Scheduler) dueBatch(ctx context.Context, next []time.Time, now time.Time) []occurrence {
	var batch []occurrence
	for i, oc := range s.specs {
		if next[i].IsZero() || next[i].After(now) {
			continue
		}
		at := next[i]
		// Several firings passed while the process was stopped or the
		// clock stepped: as at startup, only the latest counts.
		if n, err := oc.Next(at); err == nil && !n.After(now) {
			latest, ok, err := oc.Latest(now, now.Sub(at)+time.Nanosecond)
			if err == nil && ok {
				s.log.LogAttrs(ctx, slog.LevelWarn, "schedule fell behind; publishing only the latest missed occurrence",
					s.attrs(occurrence{oc, latest}, slog.String("first_missed", schedule.FormatAt(at)))...)
				at = latest
			}
		}
		batch = append(batch, occurrence{oc, at})
		next[i] = s.nextAfter(ctx, oc, now)
	}
	return batch
}

// pause sleeps up to d, retrying the outbox instead when its interval comes
// round first. It reports false once ctx has ended.
func (s *Scheduler) pause(ctx context.Context, d time.Duration, outboxDue <-chan time.Time) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-outboxDue:
		s.drain(ctx)
	case <-t.C:
	}
	return true
}

// earliest returns the earliest non-zero instant, or zero.
func earliest(ts []time.Time) time.Time {
	var e time.Time
	for _, t := range ts {
		if !t.IsZero() && (e.IsZero() || t.Before(e)) {
			e = t
		}
	}
	return e
}

// nextAfter is the schedule's first firing after t, or zero (the schedule
// is then idle for the rest of this run) when there is none.
func (s *Scheduler) nextAfter(ctx context.Context, oc schedule.Spec, t time.Time) time.Time {
	n, err := oc.Next(t)
	if err != nil {
		s.specError(ctx, oc, err)
		return time.Time{}
	}
	return n
}

func (s *Scheduler) specError(ctx context.Context, oc schedule.Spec, err error) {
	s.log.LogAttrs(ctx, slog.LevelError, "schedule cannot be evaluated; it will not fire until the scheduler is rebuilt",
		slog.String(telemetry.App, oc.App), slog.String(attrSchedule, oc.Name), slog.String("error", err.Error()))
}

// serverNow reads the authoritative clock and records its offset from the
// local clock. When it cannot be read, it returns the local estimate.
func (s *Scheduler) serverNow(ctx context.Context) time.Time {
	before := s.o.clock()
	rctx, cancel := context.WithTimeout(ctx, s.o.publishTimeout)
	t, err := s.o.now(rctx)
	cancel()
	if err != nil {
		if !s.clockDown && ctx.Err() == nil {
			s.log.LogAttrs(ctx, slog.LevelWarn, "cannot read the server clock; scheduling by the local clock",
				slog.Duration("offset", s.offset), slog.String("error", err.Error()))
		}
		s.clockDown = true
		return before.Add(s.offset)
	}
	if s.clockDown {
		s.log.LogAttrs(ctx, slog.LevelInfo, "server clock readable again")
		s.clockDown = false
	}
	// The reply was produced between the two local readings; the midpoint
	// is the best local counterpart.
	after := s.o.clock()
	s.offset = t.Sub(before.Add(after.Sub(before) / 2))
	return t
}

// failedOccurrence is an occurrence whose last publish attempt failed.
type failedOccurrence struct {
	occurrence
	err error
}

// publishAll publishes a batch of due occurrences. Attempts of the whole
// batch are interleaved with the backoff waits, so one failing occurrence
// does not delay the others by a full backoff each. What still fails goes
// to the outbox.
func (s *Scheduler) publishAll(ctx context.Context, batch []occurrence) {
	pending := batch
	var failed []failedOccurrence
	for attempt := 0; len(pending) > 0; attempt++ {
		failed = failed[:0]
		for _, oc := range pending {
			published, err := s.publishOnce(ctx, oc)
			if err != nil {
				failed = append(failed, failedOccurrence{oc, err})
				continue
			}
			s.report(ctx, oc, published)
		}
		if len(failed) == 0 || attempt >= len(s.o.backoff) || ctx.Err() != nil {
			break
		}
		wait := s.o.backoff[attempt]
		for _, f := range failed {
			s.log.LogAttrs(ctx, slog.LevelWarn, "schedule publish failed; retrying",
				s.attrs(f.occurrence, slog.Int(telemetry.Attempt, attempt+1), slog.Duration("retry_in", wait), slog.String("error", f.err.Error()))...)
		}
		if !ctxtime.Sleep(ctx, wait) {
			break
		}
		pending = pending[:0]
		for _, f := range failed {
			pending = append(pending, f.occurrence)
		}
	}
	for _, f := range failed {
		s.toOutbox(ctx, f)
	}
}

func (s *Scheduler) publishOnce(ctx context.Context, oc occurrence) (bool, error) {
	pctx, cancel := context.WithTimeout(ctx, s.o.publishTimeout)
	defer cancel()
	return s.pub.publish(pctx, s.tracer, oc.spec, oc.at)
}

func (s *Scheduler) report(ctx context.Context, oc occurrence, published bool) {
	r := Duplicate
	if published {
		r = Published
		s.log.LogAttrs(ctx, slog.LevelInfo, "schedule occurrence published", s.attrs(oc)...)
	} else {
		s.log.LogAttrs(ctx, slog.LevelDebug, "schedule occurrence already published", s.attrs(oc)...)
	}
	s.observe(oc, r)
}

func (s *Scheduler) observe(oc occurrence, r Result) {
	if s.o.observer != nil {
		s.o.observer(oc.spec, oc.at, r)
	}
}

func (s *Scheduler) toOutbox(ctx context.Context, f failedOccurrence) {
	path, err := s.outbox.put(schedule.NewEnvelope(f.spec, f.at))
	if err != nil {
		s.log.LogAttrs(ctx, slog.LevelError, "schedule occurrence lost: publish failed and the outbox cannot store it",
			s.attrs(f.occurrence, slog.String("publish_error", f.err.Error()), slog.String("error", err.Error()))...)
		s.observe(f.occurrence, Failed)
		return
	}
	attrs := s.attrs(f.occurrence, slog.String("error", f.err.Error()))
	if s.outbox.durable() {
		attrs = append(attrs, slog.String("path", path))
	}
	s.log.LogAttrs(ctx, slog.LevelWarn, "schedule publish failed; occurrence kept in the outbox", attrs...)
	s.observe(f.occurrence, Outboxed)
}

// drain retries the outbox once, oldest occurrence first. It stops at the
// first failure, which most likely means Redis is still unreachable; the
// next drain starts over.
func (s *Scheduler) drain(ctx context.Context) {
	recs, probs, err := s.outbox.list(s.o.clock())
	for _, p := range probs {
		s.log.LogAttrs(ctx, slog.LevelError, "schedule outbox file unusable",
			slog.String("path", p.path), slog.String("action", p.what), slog.String("error", p.err.Error()))
	}
	if err != nil {
		s.log.LogAttrs(ctx, slog.LevelError, "cannot read the schedule outbox", slog.String("error", err.Error()))
		return
	}
	for _, r := range recs {
		if ctx.Err() != nil {
			return
		}
		spec, ok := s.byName[[2]string{r.env.App, r.env.Schedule}]
		if !ok {
			// A schedule this Scheduler does not know (removed, or its app
			// unavailable): publish it as recorded; the consumer decides
			// whether it is obsolete.
			spec = schedule.Spec{App: r.env.App, Name: r.env.Schedule, Handler: r.env.Handler}
		}
		// The recorded handler is what the occurrence was published with.
		spec.Handler = r.env.Handler
		oc := occurrence{spec, r.at}
		published, err := s.publishOnce(ctx, oc)
		if err != nil {
			if ctx.Err() == nil {
				s.log.LogAttrs(ctx, slog.LevelWarn, "schedule outbox retry failed; will retry",
					s.attrs(oc, slog.Int("outbox_size", len(recs)), slog.String("error", err.Error()))...)
			}
			return
		}
		if err := s.outbox.remove(r); err != nil {
			// Retried later and found to be a duplicate.
			s.log.LogAttrs(ctx, slog.LevelError, "cannot remove a published occurrence from the schedule outbox", s.attrs(oc, slog.String("error", err.Error()))...)
		}
		s.report(ctx, oc, published)
	}
}
