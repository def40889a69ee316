package cron

import (
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	accept := []string{
		"* * * * *", "0 3 * * *", "*/15 * * * *", "0 9-17 * * mon-fri", "30 2 1,15 * *",
		"0 0 29 2 *", " 0 3 * * * ",
		"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually",
	}
	for _, expr := range accept {
		if _, err := Parse(expr, nil); err != nil {
			t.Errorf("Parse(%q): %v", expr, err)
		}
	}
	// Each rejection names the problem and what to write instead; the texts
	// are shown to operators by relay validate.
	reject := []struct{ expr, want string }{
		{"", `cron must not be empty; write five fields such as "0 3 * * *"`},
		{"   ", `cron must not be empty`},
		{"0 * * * * *", `cron "0 * * * * *" has 6 fields, want 5: minute hour day-of-month month day-of-week (a seconds field is not supported: schedules have minute precision)`},
		{"* * *", `cron "* * *" has 3 fields, want 5`},
		{"@every 5m", `cron "@every 5m": @every is not supported; write a five-field expression such as "*/5 * * * *"`},
		{"TZ=UTC * * * * *", `cron "TZ=UTC * * * * *" embeds a time zone; remove it and set the schedule's timezone key instead`},
		{"CRON_TZ=Europe/Berlin 0 3 * * *", `embeds a time zone`},
		{"@fortnightly", `cron "@fortnightly": unknown descriptor; use @hourly, @daily, @midnight, @weekly, @monthly, @yearly or @annually`},
		{"61 * * * *", `cron "61 * * * *": `},
		{"* * * * fri-mon-x", `cron "* * * * fri-mon-x": `},
		{"0 0 30 2 *", `cron "0 0 30 2 *" never fires: no date matches its day-of-month and month fields`},
		{"0 0 31 4,6,9,11 *", `never fires`},
	}
	for _, c := range reject {
		_, err := Parse(c.expr, nil)
		if err == nil {
			t.Errorf("Parse(%q): no error, want %q", c.expr, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %q, want it to contain %q", c.expr, err, c.want)
		}
	}
}

// The descriptors mean what docs/schedules.md says, evaluated in the schedule's
// zone.
func TestDescriptors(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	from := mustTime(t, "2026-06-10T10:20:00Z") // a Wednesday, 12:20 CEST
	for _, c := range []struct{ cron, want string }{
		{"@hourly", "2026-06-10T11:00:00Z"},
		{"@daily", "2026-06-10T22:00:00Z"},
		{"@midnight", "2026-06-10T22:00:00Z"},
		{"@weekly", "2026-06-13T22:00:00Z"}, // Sunday 00:00 CEST
		{"@monthly", "2026-06-30T22:00:00Z"},
		{"@yearly", "2026-12-31T23:00:00Z"}, // 1 January 00:00 CET
		{"@annually", "2026-12-31T23:00:00Z"},
	} {
		got, err := MustParse(c.cron, berlin).Next(from)
		if err != nil || got.Format(time.RFC3339) != c.want {
			t.Errorf("%s: Next = %v, %v; want %s", c.cron, got, err, c.want)
		}
	}
}
