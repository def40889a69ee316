package main

import (
	"strings"
	"testing"
	"time"
)

// TestRun runs the demo as go run does, on real time: its story is the
// same on every run, whatever the scheduling, since refusals (which vary
// in number) print nothing.
func TestRun(t *testing.T) {
	var out strings.Builder
	tm := demoTimings
	tm.coolDown = 100 * time.Millisecond // shorter than the demo's, for speed
	if err := run(&out, tm); err != nil {
		t.Fatal(err)
	}
	want := `attempt 1: payment provider unreachable
attempt 2: payment provider unreachable
breaker payments/charge: closed -> open
breaker payments/charge: open -> half-open
attempt 3: charged
breaker payments/charge: half-open -> closed
message acknowledged
`
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}
