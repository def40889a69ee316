package cron

import (
	"fmt"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/testutil"
)

func mustZone(t testing.TB, name string) *time.Location { return testutil.Zone(t, name) }

func mustTime(t testing.TB, s string) time.Time { return testutil.Time(t, s) }

// chain returns n successive firings of s after from, in RFC3339 UTC.
func chain(t *testing.T, s *Schedule, from time.Time, n int) []string {
	t.Helper()
	var got []string
	at := from
	for range n {
		next, err := s.Next(at)
		if err != nil {
			t.Fatalf("Next(%s): %v", at.Format(time.RFC3339), err)
		}
		got = append(got, next.Format(time.RFC3339))
		at = next
	}
	return got
}

// The expected instants below were worked out by hand from each zone's
// rules for 2026, not computed by the code under test.
func TestNextDST(t *testing.T) {
	for _, c := range []struct {
		name, zone, cron, from string
		want                   []string
	}{
		{
			// Clocks go 01:59:59 EST → 03:00 EDT at 07:00Z; 02:30 does not
			// exist that day and fires once, at the jump. robfig's own Next
			// skips that day entirely.
			name: "new york spring forward, skipped wall time fires at the jump",
			zone: "America/New_York", cron: "30 2 * * *", from: "2026-03-07T00:00:00Z",
			want: []string{"2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"},
		},
		{
			name: "new york spring forward, */15 collapses the skipped hour into 03:00",
			zone: "America/New_York", cron: "*/15 * * * *", from: "2026-03-08T06:30:00Z",
			want: []string{"2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z"},
		},
		{
			// 01:00-01:59 happens twice (EDT, then EST from 06:00Z); 01:30
			// fires the first time only. robfig fires it twice.
			name: "new york fall back, repeated wall time fires once",
			zone: "America/New_York", cron: "30 1 * * *", from: "2026-10-31T00:00:00Z",
			want: []string{"2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"},
		},
		{
			name: "new york fall back, */30 does not repeat the repeated hour",
			zone: "America/New_York", cron: "*/30 * * * *", from: "2026-11-01T04:00:00Z",
			want: []string{"2026-11-01T04:30:00Z", "2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z"},
		},
		{
			// CET → CEST at 01:00Z (02:00 → 03:00 local).
			name: "berlin spring forward",
			zone: "Europe/Berlin", cron: "30 2 * * *", from: "2026-03-28T00:00:00Z",
			want: []string{"2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"},
		},
		{
			// CEST → CET at 01:00Z (03:00 → 02:00 local); 02:30 repeats.
			name: "berlin fall back",
			zone: "Europe/Berlin", cron: "30 2 * * *", from: "2026-10-24T00:00:00Z",
			want: []string{"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"},
		},
		{
			// Lord Howe shifts by 30 minutes: +10:30 → +11 at 15:30Z on
			// 3 October (02:00 → 02:30 local), so 02:15 is skipped.
			name: "lord howe spring forward by 30 minutes",
			zone: "Australia/Lord_Howe", cron: "15 2 * * *", from: "2026-10-02T00:00:00Z",
			want: []string{"2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"},
		},
		{
			name: "lord howe spring forward, */15",
			zone: "Australia/Lord_Howe", cron: "*/15 * * * *", from: "2026-10-03T15:00:00Z",
			want: []string{"2026-10-03T15:15:00Z", "2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z"},
		},
		{
			// +11 → +10:30 at 15:00Z on 4 April (02:00 → 01:30 local), so
			// 01:30-01:59 repeats.
			name: "lord howe fall back by 30 minutes",
			zone: "Australia/Lord_Howe", cron: "45 1 * * *", from: "2026-04-03T00:00:00Z",
			want: []string{"2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"},
		},
		{
			name: "lord howe fall back, */15",
			zone: "Australia/Lord_Howe", cron: "*/15 * * * *", from: "2026-04-04T14:20:00Z",
			want: []string{"2026-04-04T14:30:00Z", "2026-04-04T14:45:00Z", "2026-04-04T15:30:00Z", "2026-04-04T15:45:00Z"},
		},
		{
			name: "utc and nil location",
			zone: "", cron: "@daily", from: "2026-03-08T12:00:00Z",
			want: []string{"2026-03-09T00:00:00Z", "2026-03-10T00:00:00Z"},
		},
		{
			// Samoa skipped 30 December 2011 entirely (UTC-10 → UTC+14 at
			// 10:00Z): that day's noon fires at the jump.
			name: "apia skipped day",
			zone: "Pacific/Apia", cron: "0 12 * * *", from: "2011-12-29T00:00:00Z",
			want: []string{"2011-12-29T22:00:00Z", "2011-12-30T10:00:00Z", "2011-12-30T22:00:00Z"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var loc *time.Location
			if c.zone != "" {
				loc = mustZone(t, c.zone)
			}
			s := MustParse(c.cron, loc)
			got := chain(t, s, mustTime(t, c.from), len(c.want))
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("firings after %s:\n got  %v\n want %v", c.from, got, c.want)
			}
		})
	}
}

// oracle lists the firings of s in [from, to) by brute force over every
// minute, from the rule itself: an instant fires when some wall-clock time
// matching the cron lies after the latest wall-clock time seen before it and
// at or before its own. A normal minute advances the wall clock by one, a
// spring-forward jumps it over the skipped times (which then fire at the
// jump), and a fall-back moves it back, so repeated times never fire again.
// Only cron matching of single wall-clock times comes from robfig (in UTC,
// where it has no DST to get wrong).
func oracle(t *testing.T, s *Schedule, from, to time.Time) []time.Time {
	t.Helper()
	fl := s.spec
	matches := func(wall time.Time) bool { return fl.Next(wall.Add(-time.Second)).Equal(wall) }
	wallOf := func(at time.Time) time.Time {
		l := at.In(s.loc)
		y, mo, d := l.Date()
		h, mi, _ := l.Clock()
		return time.Date(y, mo, d, h, mi, 0, 0, time.UTC)
	}
	var out []time.Time
	maxWall := wallOf(from.Add(-time.Minute))
	for at := from; at.Before(to); at = at.Add(time.Minute) {
		w := wallOf(at)
		fire := false
		for x := maxWall.Add(time.Minute); !x.After(w); x = x.Add(time.Minute) {
			if matches(x) {
				fire = true
				break
			}
		}
		if fire {
			out = append(out, at)
		}
		if w.After(maxWall) {
			maxWall = w
		}
	}
	return out
}

// TestOccurrencesAgainstOracle checks Next, Fires and Latest against the
// brute-force oracle and each other, minute by minute, across the 2026
// transitions of several zones.
func TestOccurrencesAgainstOracle(t *testing.T) {
	if testing.Short() {
		t.Skip("minute-by-minute scan")
	}
	transitions := map[string][]string{
		"America/New_York":    {"2026-03-08T07:00:00Z", "2026-11-01T06:00:00Z"},
		"Europe/Berlin":       {"2026-03-29T01:00:00Z", "2026-10-25T01:00:00Z"},
		"Australia/Lord_Howe": {"2026-04-04T15:00:00Z", "2026-10-03T15:30:00Z"},
		"Asia/Kolkata":        {"2026-06-01T00:00:00Z"},
		"Pacific/Apia":        {"2011-12-30T10:00:00Z"},
		"America/Sao_Paulo":   {"2018-11-04T03:00:00Z"}, // midnight skipped
	}
	crons := []string{"*/15 * * * *", "30 2 * * *", "0 * * * *", "45 1 * * *", "0 0 * * *", "*/7 1-3 * * 0", "15,45 0-3 * * *"}
	for zone, ts := range transitions {
		loc := mustZone(t, zone)
		for _, ts := range ts {
			for _, cr := range crons {
				t.Run(zone+"/"+ts+"/"+cr, func(t *testing.T) {
					s := MustParse(cr, loc)
					center := mustTime(t, ts)
					from, to := center.Add(-30*time.Hour), center.Add(30*time.Hour)
					want := oracle(t, s, from, to)
					checkAgainst(t, s, center, from, to, want)
				})
			}
		}
	}
}

func checkAgainst(t *testing.T, s *Schedule, center, from, to time.Time, want []time.Time) {
	t.Helper()
	// The chain of Next from just before `from` is exactly the oracle's list.
	var got []time.Time
	at := from.Add(-time.Nanosecond)
	for {
		n, err := s.Next(at)
		if err != nil {
			t.Fatal(err)
		}
		if !n.Before(to) {
			break
		}
		if n.Second() != 0 || n.Nanosecond() != 0 || n.Location() != time.UTC {
			t.Fatalf("Next returned %v, want a whole minute in UTC", n)
		}
		got = append(got, n)
		at = n
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Next chain differs from the oracle:\n got  %v\n want %v", got, want)
	}
	// Fires agrees with the list, Next returns the following firing and
	// Latest the preceding one: at every minute near the transition and at
	// every sparse-th minute (a prime, so every minute of the hour is hit
	// across the scan) further out. -race builds scan less: this code is
	// single-goroutine and ten times slower there.
	dense, sparse := 2*time.Hour, time.Duration(37)
	if raceEnabled {
		dense, sparse = 30*time.Minute, 97
	}
	i := 0 // index of the first firing >= m
	for m := from; m.Before(to); m = m.Add(time.Minute) {
		if d := m.Sub(center).Abs(); d > dense && m.Sub(from)/time.Minute%sparse != 0 {
			continue
		}
		for i < len(want) && want[i].Before(m) {
			i++
		}
		isFiring := i < len(want) && want[i].Equal(m)
		fires, err := s.Fires(m)
		if err != nil {
			t.Fatal(err)
		}
		if fires != isFiring {
			t.Fatalf("Fires(%s) = %v, want %v", m.Format(time.RFC3339), fires, isFiring)
		}
		if fires, _ := s.Fires(m.Add(30 * time.Second)); fires {
			t.Fatalf("Fires(%s) = true for a time that is not a whole minute", m.Add(30*time.Second))
		}
		nextIdx := i
		if isFiring {
			nextIdx++
		}
		if nextIdx < len(want) {
			n, err := s.Next(m)
			if err != nil || !n.Equal(want[nextIdx]) {
				t.Fatalf("Next(%s) = %v, %v; want %v", m.Format(time.RFC3339), n, err, want[nextIdx])
			}
		}
		// The latest firing at or before m within 3h, if the list knows it.
		lastIdx := i - 1
		if isFiring {
			lastIdx = i
		}
		if lastIdx >= 0 || m.Sub(from) >= 3*time.Hour {
			l, ok, err := s.Latest(m, 3*time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			wantOK := lastIdx >= 0 && m.Sub(want[lastIdx]) < 3*time.Hour
			if ok != wantOK || (ok && !l.Equal(want[lastIdx])) {
				t.Fatalf("Latest(%s, 3h) = %v, %v; want index %d of %v", m.Format(time.RFC3339), l, ok, lastIdx, want)
			}
		}
	}
}

func TestLatestWindow(t *testing.T) {
	s := MustParse("0 12 * * *", nil)
	noon := mustTime(t, "2026-03-10T12:00:00Z")
	for _, c := range []struct {
		name   string
		now    time.Time
		window time.Duration
		want   time.Time
		ok     bool
	}{
		{"firing at now is included", noon, time.Hour, noon, true},
		{"latest within the window", noon.Add(23 * time.Hour), 24 * time.Hour, noon, true},
		{"latest exactly window ago is excluded", noon.Add(24 * time.Hour).Add(-time.Nanosecond), 24*time.Hour - time.Nanosecond, time.Time{}, false},
		{"older than the window", noon.Add(23*time.Hour + time.Minute), 23 * time.Hour, time.Time{}, false},
		{"zero window", noon, 0, time.Time{}, false},
		{"several within the window: the latest", noon.Add(50 * time.Hour), 72 * time.Hour, noon.Add(48 * time.Hour), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok, err := s.Latest(c.now, c.window)
			if err != nil || ok != c.ok || !got.Equal(c.want) {
				t.Errorf("Latest(%s, %s) = %v, %v, %v; want %v, %v", c.now.Format(time.RFC3339), c.window, got, ok, err, c.want, c.ok)
			}
		})
	}
}

func BenchmarkNext(b *testing.B) {
	s := MustParse("*/15 * * * *", mustZone(b, "America/New_York"))
	at := mustTime(b, "2026-03-08T05:00:00Z")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Next(at); err != nil {
			b.Fatal(err)
		}
	}
}
