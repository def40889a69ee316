package cron

import (
	"fmt"
	"time"
)

// maxSteps bounds the wall-clock candidates one Next call examines. Real
// zones need a handful (an hour of */1 minutes across a DST shift is 60);
// only a day-long shift such as Samoa's in 2011 comes near a few thousand.
const maxSteps = 10000

// lookAround is how far either side of an instant the zone is inspected.
// Every real UTC offset lies within ±14h, so an instant whose wall-clock
// time is c lies within 15h of c read as UTC.
const lookAround = 15 * time.Hour

// Next returns the first firing instant of s strictly after after, in UTC,
// on a whole minute.
//
// Firings follow Relay's DST rules (docs/schedules.md#missed-occurrences-and-daylight-saving-time):
// every wall-clock time in the schedule's zone that matches the expression
// fires exactly once. A wall time skipped by a spring-forward fires at the
// instant of the jump (a daily 02:30 in America/New_York fires at 03:00 EDT
// on the day clocks go forward); a wall time repeated by a fall-back fires
// only the first time it occurs (01:30 EDT, not again at 01:30 EST). So
// "*/15 * * * *" fires at 01:45 EST and then 03:00 EDT when New York springs
// forward, and has no firings between 01:45 EDT and 02:00 EST when it falls
// back. Several skipped wall times that map to the same instant fire once.
//
// It returns an error when no firing is found within five years.
func (s *Schedule) Next(after time.Time) (time.Time, error) {
	// instant() never maps a wall-clock time c to an instant later than c
	// minus the smallest offset in force around it, so no wall-clock time at
	// or before after+minOffset can fire after `after`. Starting there skips
	// everything that cannot qualify while still seeing the occurrences
	// that a fall-back or spring-forward moves across `after`.
	c := after.UTC().Add(s.minOffset(after))
	for range maxSteps {
		c = s.spec.Next(c)
		if c.IsZero() {
			return time.Time{}, fmt.Errorf("cron %q has no firing within five years after %s", s.expr, after.UTC().Format(time.RFC3339))
		}
		// Instants never decrease as wall-clock times increase, so the first
		// candidate past `after` is the earliest firing.
		if t := s.instant(c); t.After(after) {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("cron %q: no firing found after %s within %d candidate times", s.expr, after.UTC().Format(time.RFC3339), maxSteps)
}

// Fires reports whether at is a firing instant of s, that is, whether Next
// would return exactly at for some earlier instant. Instants that are not
// whole minutes never fire. The error is Next's.
func (s *Schedule) Fires(at time.Time) (bool, error) {
	if !at.Truncate(time.Minute).Equal(at) {
		return false, nil
	}
	t, err := s.Next(at.Add(-time.Nanosecond))
	if err != nil {
		return false, err
	}
	return t.Equal(at), nil
}

// Latest returns the latest firing instant of s in the interval
// (now-window, now], in UTC, and whether there is one. A window <= 0 holds
// no instant. It is the occurrence start-up catch-up publishes
// (docs/schedules.md#missed-occurrences-and-daylight-saving-time: only the latest missed occurrence within 24h).
func (s *Schedule) Latest(now time.Time, window time.Duration) (time.Time, bool, error) {
	if window <= 0 {
		return time.Time{}, false, nil
	}
	lo := now.Add(-window)
	// Look back a growing distance, so a frequent schedule walks a few
	// firings forward instead of a whole window's worth.
	for back := time.Hour; ; back *= 4 {
		from := now.Add(-back)
		if back >= window {
			from = lo
		}
		t, err := s.Next(from)
		if err != nil {
			return time.Time{}, false, err
		}
		if !t.After(now) {
			for {
				n, err := s.Next(t)
				if err != nil {
					return time.Time{}, false, err
				}
				if n.After(now) {
					return t, true, nil
				}
				t = n
			}
		}
		if from.Equal(lo) {
			return time.Time{}, false, nil
		}
	}
}

// instant maps the wall-clock time c (written as a UTC value) to the instant
// it fires at in s.loc: the first instant whose wall clock reads c, or, when
// a forward shift skips c, the instant of that shift.
func (s *Schedule) instant(c time.Time) time.Time {
	var prev period
	first := true
	for p := range periods(s.loc, c.Add(-lookAround), c.Add(lookAround)) {
		if !first && prev.offset < p.offset {
			// Wall-clock times in [start+before, start+after) do not exist:
			// the clock jumped over them at p.start.
			if !c.Before(p.start.Add(prev.offset)) && c.Before(p.start.Add(p.offset)) {
				return p.start.UTC()
			}
		}
		// The candidate whose wall clock reads c under this period's offset
		// is real only if it falls inside the period. Periods come in time
		// order, so the first hit is the earliest (the first pass through a
		// repeated wall time).
		if t := c.Add(-p.offset); p.contains(t) {
			return t.UTC()
		}
		prev, first = p, false
	}
	// Unreachable for real zone data: every wall-clock time either exists
	// or lies in a gap. Fall back to Go's own choice rather than fail.
	return time.Date(c.Year(), c.Month(), c.Day(), c.Hour(), c.Minute(), c.Second(), 0, s.loc).UTC()
}

// minOffset returns the smallest UTC offset s.loc uses within a day and a
// half of t.
func (s *Schedule) minOffset(t time.Time) time.Duration {
	low, first := time.Duration(0), true
	for p := range periods(s.loc, t.Add(-36*time.Hour), t.Add(36*time.Hour)) {
		if first || p.offset < low {
			low, first = p.offset, false
		}
	}
	return low
}

// period is a span of instants during which a zone keeps one UTC offset.
// A zero start or end means unbounded.
type period struct {
	start, end time.Time
	offset     time.Duration
}

func (p period) contains(t time.Time) bool {
	return (p.start.IsZero() || !t.Before(p.start)) && (p.end.IsZero() || t.Before(p.end))
}

// periods yields, in time order, the periods of loc that overlap [from, to].
// Consecutive periods with the same offset (a change of abbreviation only)
// are yielded separately; callers handle that.
func periods(loc *time.Location, from, to time.Time) func(yield func(period) bool) {
	return func(yield func(period) bool) {
		t := from
		for {
			lt := t.In(loc)
			_, off := lt.Zone()
			start, end := lt.ZoneBounds()
			if !yield(period{start: start, end: end, offset: time.Duration(off) * time.Second}) {
				return
			}
			if end.IsZero() || end.After(to) {
				return
			}
			t = end
		}
	}
}
