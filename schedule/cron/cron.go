// Package cron evaluates the cron expression of a schedule in its time zone
// with Relay's daylight-saving rules (docs/schedules.md#cron-expressions).
//
// robfig/cron parses the expressions and matches wall-clock times; its own
// Next drops wall-clock times a spring-forward skips and fires repeated ones
// twice, so Schedule maps wall-clock times to instants itself. A Schedule is
// immutable and safe for concurrent use. The package reads no clock: every
// method takes the instant it works from.
package cron

import (
	"fmt"
	"strings"
	"time"

	robfig "github.com/robfig/cron/v3"
)

// neverFiresProbe is the instant Parse asks for a first firing after.
// robfig's Next looks five years ahead, which covers every day-month
// combination from here, including 29 February (2000 is a leap year).
var neverFiresProbe = time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC)

// Schedule is a parsed cron expression and the zone it fires in.
type Schedule struct {
	expr string
	// spec evaluates wall-clock times written as UTC values ("floating"):
	// UTC has no DST, so robfig's Next is exact there, and instant maps the
	// wall-clock times it returns to instants of loc.
	spec *robfig.SpecSchedule
	loc  *time.Location
}

// Parse parses a schedule's cron expression (docs/schedules.md#cron-expressions):
// five fields (minute hour day-of-month month day-of-week) or one of
// @hourly @daily @midnight @weekly @monthly @yearly @annually, evaluated in
// loc (nil means UTC). Seconds fields, @every and embedded TZ=/CRON_TZ= are
// rejected: schedules have minute precision and their zone is the
// schedule's timezone key. An expression that names no real date (such as
// "0 0 30 2 *") is rejected too, since it would never fire. Errors quote the
// expression and say what to write instead.
func Parse(expr string, loc *time.Location) (*Schedule, error) {
	e := strings.TrimSpace(expr)
	switch {
	case e == "":
		return nil, fmt.Errorf("cron must not be empty; write five fields such as \"0 3 * * *\"")
	case strings.HasPrefix(e, "TZ=") || strings.HasPrefix(e, "CRON_TZ="):
		return nil, fmt.Errorf("cron %q embeds a time zone; remove it and set the schedule's timezone key instead", expr)
	case strings.HasPrefix(e, "@every"):
		return nil, fmt.Errorf("cron %q: @every is not supported; write a five-field expression such as \"*/5 * * * *\"", expr)
	case strings.HasPrefix(e, "@"):
		switch e {
		case "@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually":
		default:
			return nil, fmt.Errorf("cron %q: unknown descriptor; use @hourly, @daily, @midnight, @weekly, @monthly, @yearly or @annually", expr)
		}
	default:
		if n := len(strings.Fields(e)); n != 5 {
			hint := ""
			if n == 6 {
				hint = " (a seconds field is not supported: schedules have minute precision)"
			}
			return nil, fmt.Errorf("cron %q has %d fields, want 5: minute hour day-of-month month day-of-week%s", expr, n, hint)
		}
	}
	parsed, err := robfig.ParseStandard(e)
	if err != nil {
		return nil, fmt.Errorf("cron %q: %v", expr, err)
	}
	// ParseStandard returns a *SpecSchedule for every form accepted above
	// (only @every yields another type, and it is rejected).
	s, ok := parsed.(*robfig.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("cron %q: unsupported schedule type %T", expr, parsed)
	}
	floating := *s
	floating.Location = time.UTC
	if floating.Next(neverFiresProbe).IsZero() {
		return nil, fmt.Errorf("cron %q never fires: no date matches its day-of-month and month fields", expr)
	}
	if loc == nil {
		loc = time.UTC
	}
	return &Schedule{expr: expr, spec: &floating, loc: loc}, nil
}

// MustParse is Parse for expressions known to be valid, such as literals in
// Go-defined apps; it panics on an error.
func MustParse(expr string, loc *time.Location) *Schedule {
	s, err := Parse(expr, loc)
	if err != nil {
		panic(err)
	}
	return s
}

// String returns the expression as written.
func (s *Schedule) String() string { return s.expr }

// Location returns the zone the schedule fires in.
func (s *Schedule) Location() *time.Location { return s.loc }
