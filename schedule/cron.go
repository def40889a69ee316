package schedule

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// neverFiresProbe is the instant ParseCron asks for a first firing after.
// robfig's Next looks five years ahead, which covers every day-month
// combination from here, including 29 February (2000 is a leap year).
var neverFiresProbe = time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC)

// ParseCron parses a schedule's cron expression (reference.md "Schedules"):
// five fields (minute hour day-of-month month day-of-week) or one of
// @hourly @daily @midnight @weekly @monthly @yearly @annually. Seconds
// fields, @every and embedded TZ=/CRON_TZ= are rejected: schedules have
// minute precision and their zone is the schedule's timezone key. An
// expression that names no real date (such as "0 0 30 2 *") is rejected too,
// since it would never fire.
//
// The returned schedule is always a *cron.SpecSchedule. Its Location is
// time.Local, as robfig leaves it, so do not call its Next yourself: use
// Spec.Next, which applies Relay's DST rules in the schedule's zone.
// Errors quote the expression and say what to write instead.
func ParseCron(expr string) (cron.Schedule, error) {
	s, err := parseSpec(expr)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// parseSpec is ParseCron with the concrete type.
func parseSpec(expr string) (*cron.SpecSchedule, error) {
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
	parsed, err := cron.ParseStandard(e)
	if err != nil {
		return nil, fmt.Errorf("cron %q: %v", expr, err)
	}
	// ParseStandard returns a *SpecSchedule for every form accepted above
	// (only @every yields another type, and it is rejected).
	s, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("cron %q: unsupported schedule type %T", expr, parsed)
	}
	if floating(s).Next(neverFiresProbe).IsZero() {
		return nil, fmt.Errorf("cron %q never fires: no date matches its day-of-month and month fields", expr)
	}
	return s, nil
}

// floating returns a copy of s that evaluates wall-clock times written as
// UTC values. UTC has no DST, so robfig's Next is exact there; Spec maps the
// wall-clock times it returns to instants of the real zone itself.
func floating(s *cron.SpecSchedule) *cron.SpecSchedule {
	c := *s
	c.Location = time.UTC
	return &c
}
