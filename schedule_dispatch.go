package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/schedule"
)

// maxOccurrenceLead is how far ahead of this worker's clock an occurrence
// may be scheduled: room for clock skew between workers and Redis.
const maxOccurrenceLead = 5 * time.Minute

// scheduleField is the reserved invocation-state field holding the pin of
// a schedule occurrence (reference.md "Schedules").
const scheduleField = "__schedule"

// schedulePin is what the first delivery of an occurrence fixes for every
// later one: a template change after that does not change which handler
// runs, with which limits, or which cron the occurrence is checked against.
type schedulePin struct {
	Handler   string `json:"handler"`
	TimeoutMS int64  `json:"timeout_ms"`
	Retries   int    `json:"retries"`
	Cron      string `json:"cron"`
	Timezone  string `json:"timezone"`
}

// isOccurrence reports whether a stream entry's event is a schedule
// occurrence envelope.
func isOccurrence(event string) bool { return schedule.IsEnvelope([]byte(event)) }

// ScheduleSpecs returns the schedules of every app in apps in the shape
// the schedule package evaluates.
func ScheduleSpecs(apps *Apps) []schedule.Spec {
	var specs []schedule.Spec
	for _, a := range apps.List() {
		for _, s := range a.Schedules {
			specs = append(specs, schedule.Spec{App: a.Name, Name: s.Name, Handler: s.Handler, Cron: s.Cron, Location: s.Timezone})
		}
	}
	return specs
}

// occurrence dispatches one schedule occurrence straight to its schedule's
// handler: an invalid envelope is dead-lettered, an occurrence of a
// schedule or app that no longer exists is obsolete (acknowledged without
// a DLQ entry), one of an unavailable app stays pending (reference.md
// "Schedules").
func (e *Engine) occurrence(ctx, runCtx context.Context, d *delivery) {
	env, err := schedule.DecodeEnvelope([]byte(d.event))
	var at time.Time
	if err == nil {
		at, err = env.Time()
	}
	// The identity is checked before the schedule is looked up, so a
	// forged entry is dead-lettered rather than passed off as obsolete.
	if err == nil && env.OccurrenceID != schedule.OccurrenceID(env.App, env.Schedule, at) {
		err = fmt.Errorf("%w: occurrence_id %q is not the identity of app %q schedule %q at %s",
			schedule.ErrInvalidEnvelope, env.OccurrenceID, env.App, env.Schedule, env.ScheduledAt)
	}
	if err == nil && at.After(time.Now().Add(maxOccurrenceLead)) {
		// Schedulers publish on the Redis clock when an occurrence is due;
		// one far ahead of this worker's clock was not published by them.
		err = fmt.Errorf("%w: scheduled_at %s is in the future", schedule.ErrInvalidEnvelope, env.ScheduledAt)
	}
	if err != nil {
		e.deadLetterMessage(ctx, d, "invalid schedule occurrence: "+err.Error())
		return
	}
	attrs := func(extra ...slog.Attr) []slog.Attr {
		return e.logAttrs(d, append([]slog.Attr{slog.String(telemetry.App, env.App), slog.String("schedule", env.Schedule),
			slog.String("scheduled_at", env.ScheduledAt)}, extra...)...)
	}
	app := e.apps.Get(env.App)
	if app == nil {
		e.log.LogAttrs(ctx, slog.LevelInfo, "schedule occurrence obsolete: app no longer exists; acknowledged", attrs()...)
		e.ack(ctx, d, true) // an earlier delivery may have left state: retain it
		return
	}
	if !app.Available() {
		d.held = true
		e.log.LogAttrs(ctx, slog.LevelWarn, "app unavailable; schedule occurrence left pending", attrs(slog.Any("error", app.Errors.Err()))...)
		return
	}
	var sched *Schedule
	for i := range app.Schedules {
		if app.Schedules[i].Name == env.Schedule {
			sched = &app.Schedules[i]
		}
	}
	if sched == nil {
		e.log.LogAttrs(ctx, slog.LevelInfo, "schedule occurrence obsolete: schedule no longer exists; acknowledged", attrs()...)
		e.ack(ctx, d, true)
		return
	}
	pin, err := e.pin(ctx, d, sched)
	if errors.Is(err, invocation.ErrTerminal) {
		// Another delivery finished it and the message left the PEL.
		e.ack(ctx, d, false)
		return
	}
	if err != nil {
		d.held = true
		e.log.LogAttrs(ctx, slog.LevelError, "pinning schedule occurrence failed; left pending", attrs(slog.Any("error", err))...)
		return
	}
	loc, err := time.LoadLocation(pin.Timezone)
	if err != nil {
		// The zone was loadable when it was pinned: this host's tzdata
		// lacks it. Another worker may have it.
		d.held = true
		e.log.LogAttrs(ctx, slog.LevelError, "pinned time zone unknown on this host; schedule occurrence left pending", attrs(slog.Any("error", err))...)
		return
	}
	spec := schedule.Spec{App: app.Name, Name: sched.Name, Handler: pin.Handler, Cron: pin.Cron, Location: loc}
	if err := env.Validate(spec); err != nil {
		if !errors.Is(err, schedule.ErrInvalidEnvelope) {
			d.held = true
			e.log.LogAttrs(ctx, slog.LevelError, "checking schedule occurrence failed; left pending", attrs(slog.Any("error", err))...)
			return
		}
		e.deadLetterMessage(ctx, d, "invalid schedule occurrence: "+err.Error())
		return
	}
	e.drive(ctx, runCtx, d, call{
		app: app, handler: pin.Handler, timeout: time.Duration(pin.TimeoutMS) * time.Millisecond,
		retries: pin.Retries, input: env.Input(),
	})
	if d.held {
		e.log.LogAttrs(ctx, slog.LevelDebug, "message left pending", e.logAttrs(d)...)
		return
	}
	e.ack(ctx, d, true)
}

// pin fixes the schedule's current handler, limits and cron for this
// occurrence unless an earlier delivery did, and returns what is pinned.
func (e *Engine) pin(ctx context.Context, d *delivery, s *Schedule) (schedulePin, error) {
	want, err := json.Marshal(schedulePin{
		Handler: s.Handler, TimeoutMS: s.Timeout.Milliseconds(), Retries: s.Retries,
		Cron: s.Cron, Timezone: s.Timezone.String(),
	})
	if err != nil {
		return schedulePin{}, err
	}
	var stored string
	err = persist(ctx, func(octx context.Context) (err error) {
		stored, err = e.c.State.Pin(octx, d.key, scheduleField, string(want))
		return err
	})
	if err != nil {
		return schedulePin{}, err
	}
	var p schedulePin
	if err := json.Unmarshal([]byte(stored), &p); err != nil || p.Handler == "" || p.TimeoutMS <= 0 || p.Retries < 0 {
		return schedulePin{}, fmt.Errorf("stored pin %q is malformed", stored)
	}
	return p, nil
}
