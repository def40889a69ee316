package schedule

import (
	"errors"
	"fmt"
	"time"
)

// Cron says when a schedule fires: instants in UTC on whole minutes, with
// Relay's daylight-saving rules (docs/schedules.md#missed-occurrences-and-daylight-saving-time).
// Package schedule/cron implements it (cron.Parse); the interface keeps this
// package, and the engine that imports it, free of a cron parser.
type Cron interface {
	// Next returns the first firing strictly after after.
	Next(after time.Time) (time.Time, error)
	// Fires reports whether at is a firing.
	Fires(at time.Time) (bool, error)
	// Latest returns the latest firing in (now-window, now], if any.
	Latest(now time.Time, window time.Duration) (time.Time, bool, error)
	// String returns the expression as written.
	String() string
	// Location returns the zone the expression is evaluated in.
	Location() *time.Location
}

// Spec is one schedule of one app: the part of an app's schedules[] entry
// that decides when it fires and where an occurrence goes
// (docs/schedules.md).
//
// App and Name identify the schedule (they are part of the occurrence
// identity and the dedup key); Handler is copied into each envelope; Cron
// says when it fires, in the schedule's zone.
type Spec struct {
	App     string
	Name    string
	Handler string
	Cron    Cron
}

var errNoCron = errors.New("no cron")

// Next returns the first firing instant of s strictly after after (Cron.Next).
func (s Spec) Next(after time.Time) (time.Time, error) {
	if s.Cron == nil {
		return time.Time{}, s.wrap(errNoCron)
	}
	t, err := s.Cron.Next(after)
	return t, s.wrap(err)
}

// Fires reports whether at is a firing instant of s (Cron.Fires).
func (s Spec) Fires(at time.Time) (bool, error) {
	if s.Cron == nil {
		return false, s.wrap(errNoCron)
	}
	ok, err := s.Cron.Fires(at)
	return ok, s.wrap(err)
}

// Latest returns the latest firing instant of s in (now-window, now]
// (Cron.Latest): the occurrence start-up catch-up publishes.
func (s Spec) Latest(now time.Time, window time.Duration) (time.Time, bool, error) {
	if s.Cron == nil {
		return time.Time{}, false, s.wrap(errNoCron)
	}
	t, ok, err := s.Cron.Latest(now, window)
	return t, ok, s.wrap(err)
}

func (s Spec) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("schedule %s/%s: %w", s.App, s.Name, err)
}
