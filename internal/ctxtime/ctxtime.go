// Package ctxtime holds time helpers that respect a context.
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits d or until ctx is done, and reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Every calls fn every d until ctx is done; it returns after the call in
// progress, if any, ends.
func Every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

// reportEvery is how many failures in a row a Failures lets pass between
// two it reports.
const reportEvery = 30

// Failures tells a job run by Every which of its failures to log: the first
// of a run of failures in a row and every 30th after it, so an outage
// writes a line every 30 runs rather than one per run. The zero value is
// ready; it is not safe for concurrent use.
type Failures struct{ n int }

// Note records the outcome of one run: nil ends a run of failures. For an
// error it returns how many failures in a row that makes and whether to
// log this one.
func (f *Failures) Note(err error) (inARow int, report bool) {
	if err == nil {
		f.n = 0
		return 0, false
	}
	f.n++
	return f.n, (f.n-1)%reportEvery == 0
}
