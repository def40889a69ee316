package relaytest

import (
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"testing"
	"time"
)

// AdvanceByPolling returns an Advance function for a harness whose
// implementation runs on real time (a Redis server's clock): it returns
// once now reports a time at least d after the time it read first, polling
// every millisecond. now must read the implementation's own clock, so that
// a skewed test host cannot end the wait early.
func AdvanceByPolling(now func(t *testing.T) time.Time) func(t *testing.T, d time.Duration) {
	return func(t *testing.T, d time.Duration) {
		t.Helper()
		until := now(t).Add(d)
		deadline := time.Now().Add(d + 10*time.Second)
		for now(t).Before(until) {
			if time.Now().After(deadline) {
				t.Fatalf("relaytest: the implementation's clock did not advance %s within %s of real time", d, d+10*time.Second)
			}
			select {
			case <-t.Context().Done():
				t.Fatalf("relaytest: advancing the clock: %v", t.Context().Err())
			case <-time.After(time.Millisecond):
			}
		}
	}
}

// AdvanceManual returns an Advance function that steps c.
func AdvanceManual(c *ManualClock) func(t *testing.T, d time.Duration) {
	return func(_ *testing.T, d time.Duration) { c.Advance(d) }
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// UniqueName returns a name unique to this run of test t, built from its
// name, safe as a stream, group or key name. The suites name every stream,
// group and message key with it, so they never need a flushed database and
// their sub-tests run in parallel.
func UniqueName(t testing.TB) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	s := unsafeName.ReplaceAllString(t.Name(), "_")
	if len(s) > 48 {
		s = s[len(s)-48:]
	}
	return "relaytest." + s + "." + hex.EncodeToString(b)
}
