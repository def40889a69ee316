package dlq_test

import (
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/dlq"
)

func TestParseAge(t *testing.T) {
	now := time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"30m":                  now.Add(-30 * time.Minute),
		" 12h ":                now.Add(-12 * time.Hour),
		"7d":                   now.Add(-7 * 24 * time.Hour),
		"1.5d":                 now.Add(-36 * time.Hour),
		"2026-09-01T00:00:00Z": time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC),
	} {
		got, err := dlq.ParseAge(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseAge(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"-5m", "yesterday", "7days", "d"} {
		if _, err := dlq.ParseAge(in, now); err == nil || !strings.Contains(err.Error(), in) {
			t.Errorf("ParseAge(%q): %v, want an error quoting the input", in, err)
		}
	}
}
