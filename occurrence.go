package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/schedule"
)

// maxOccurrenceLead is how far ahead of this worker's clock an occurrence
// may be scheduled: room for clock skew between workers and Redis.
const maxOccurrenceLead = 5 * time.Minute

// scheduleField is the reserved invocation-state field holding the pin of
// a schedule occurrence (docs/schedules.md#the-stream-entry).
const scheduleField = "__schedule"

// schedulePin is what the first delivery of an occurrence fixes for every
// later one: a template change after that does not change which handler
// runs, with which limits. Cron and Timezone record what the occurrence was
// checked against.
type schedulePin struct {
	Handler   string `json:"handler"`
	TimeoutMS int64  `json:"timeout_ms"`
	Retries   int    `json:"retries"`
	Cron      string `json:"cron"`
	Timezone  string `json:"timezone"`
}

// occurrence is the match stage of a schedule occurrence
// (docs/schedules.md#the-stream-entry): instead of matching patterns it
// resolves the occurrence to its schedule's handler. An invalid envelope
// is dead-lettered; an occurrence of a schedule or app that no longer
// exists is obsolete (acknowledged without a DLQ entry); one of an
// unavailable app stays pending.
func (p *pipeline) occurrence(ctx context.Context, d *delivery) plan {
	env, err := p.checkEnvelope([]byte(d.event))
	if err != nil {
		return invalidOccurrence(err)
	}
	attrs := []slog.Attr{slog.String("schedule", env.Schedule), slog.String("scheduled_at", env.ScheduledAt)}
	a := d.gen.apps.Get(env.App)
	if a == nil {
		p.obs.message(ctx, d, msgEvent{kind: msgObsolete, reason: "app no longer exists", app: env.App, attrs: attrs})
		return plan{ack: true, hasState: true} // an earlier delivery may have left state: retain it
	}
	held := func(msg string, err error) plan {
		return plan{pending: &pendingReason{level: slog.LevelError, msg: msg, err: err, attrs: append(attrs, slog.String("app", a.Name)), app: a.Name}}
	}
	if !a.Available() {
		pl := held("app unavailable; schedule occurrence left pending", a.Errors.Err())
		pl.pending.level = slog.LevelWarn
		return pl
	}
	s := a.Schedule(env.Schedule)
	if s == nil {
		p.obs.message(ctx, d, msgEvent{kind: msgObsolete, reason: "schedule no longer exists", app: env.App, attrs: attrs})
		return plan{ack: true, hasState: true}
	}
	pin, err := p.pin(ctx, d, s)
	if errors.Is(err, invocation.ErrTerminal) {
		// Another delivery finished it and the message left the PEL: the
		// ack below is inert.
		return plan{ack: true}
	}
	if err != nil {
		return held("pinning schedule occurrence failed; left pending", err)
	}
	// The occurrence must be a firing of the cron it is pinned to. The
	// first delivery pinned the schedule's cron as it was then and checked
	// it; a later one whose template still has that cron checks it the same
	// way. One whose template changed since adopts the pin: its first
	// delivery checked it against that cron, and dead-lettered it if it
	// did not fire then.
	if pin.Cron == s.Cron.String() && pin.Timezone == s.Timezone().String() {
		err := env.Validate(schedule.Spec{App: a.Name, Name: s.Name, Handler: pin.Handler, Cron: s.Cron})
		if errors.Is(err, schedule.ErrInvalidEnvelope) {
			return invalidOccurrence(err)
		}
		if err != nil {
			return held("checking schedule occurrence failed; left pending", err)
		}
	}
	c := call{app: a.Name, handler: pin.Handler, timeout: time.Duration(pin.TimeoutMS) * time.Millisecond,
		retries: pin.Retries, input: env.Input(), field: invocation.Field(a.Name, pin.Handler)}
	return plan{calls: []call{c}, hasState: true}
}

// checkEnvelope decodes an occurrence envelope and checks what needs no
// schedule: its identity, and that it is not far in the future. The
// identity is checked before the schedule is looked up, so a forged entry
// is dead-lettered rather than passed off as obsolete.
func (p *pipeline) checkEnvelope(event []byte) (schedule.Envelope, error) {
	env, err := schedule.DecodeEnvelope(event)
	if err != nil {
		return env, err
	}
	at, err := env.Time()
	if err != nil {
		return env, err
	}
	if env.OccurrenceID != schedule.OccurrenceID(env.App, env.Schedule, at) {
		return env, fmt.Errorf("%w: occurrence_id %q is not the identity of app %q schedule %q at %s",
			schedule.ErrInvalidEnvelope, env.OccurrenceID, env.App, env.Schedule, env.ScheduledAt)
	}
	if at.After(time.Now().Add(maxOccurrenceLead)) {
		// Schedulers publish on the Redis clock when an occurrence is due;
		// one far ahead of this worker's clock was not published by them.
		return env, fmt.Errorf("%w: scheduled_at %s is in the future", schedule.ErrInvalidEnvelope, env.ScheduledAt)
	}
	return env, nil
}

// invalidOccurrence dead-letters an occurrence that must not run.
func invalidOccurrence(err error) plan {
	why := strings.TrimPrefix(err.Error(), schedule.ErrInvalidEnvelope.Error()+": ")
	return plan{deadLetter: "invalid schedule occurrence: " + why, hasState: true}
}

// pin fixes the schedule's current handler, limits and cron for this
// occurrence unless an earlier delivery did, and returns what is pinned.
func (p *pipeline) pin(ctx context.Context, d *delivery, s *app.Schedule) (schedulePin, error) {
	want, err := json.Marshal(schedulePin{
		// Whole milliseconds, rounded up: a timeout under 1ms is valid
		// (> 0) and must not pin 0, which reads as malformed.
		Handler: s.Handler, TimeoutMS: (s.Timeout + time.Millisecond - 1).Milliseconds(), Retries: s.Retries,
		Cron: s.Cron.String(), Timezone: s.Timezone().String(),
	})
	if err != nil {
		return schedulePin{}, err
	}
	var stored string
	err = p.persist(ctx, func(octx context.Context) (err error) {
		defer p.act.block()()
		stored, err = p.state.Pin(octx, d.key, scheduleField, string(want))
		return err
	})
	if err != nil {
		return schedulePin{}, err
	}
	var pin schedulePin
	if err := json.Unmarshal([]byte(stored), &pin); err != nil || pin.Handler == "" || pin.TimeoutMS <= 0 || pin.Retries < 0 {
		return schedulePin{}, fmt.Errorf("stored pin %q is malformed", stored)
	}
	return pin, nil
}
