package ctxtime

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	if !Sleep(t.Context(), 0) {
		t.Error("Sleep(0) with a live context = false, want true")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if Sleep(ctx, 1<<62) {
		t.Error("Sleep with a done context = true, want false")
	}
}

func TestEveryStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	calls := 0
	Every(ctx, time.Millisecond, func() {
		calls++
		if calls == 3 {
			cancel()
		}
	})
	if calls != 3 {
		t.Errorf("Every called fn %d times after its context ended at the 3rd, want 3", calls)
	}
}

// TestFailuresReportsTheFirstAndEvery30th: of 61 failures in a row the
// 1st, 31st and 61st are reported; a success starts a new run.
func TestFailuresReportsTheFirstAndEvery30th(t *testing.T) {
	var f Failures
	boom := errors.New("boom")
	var reported []int
	for range 61 {
		if n, ok := f.Note(boom); ok {
			reported = append(reported, n)
		}
	}
	if fmt.Sprint(reported) != "[1 31 61]" {
		t.Errorf("reported failures %v, want [1 31 61]", reported)
	}
	if n, ok := f.Note(nil); n != 0 || ok {
		t.Errorf("a success: %d, %v", n, ok)
	}
	if n, ok := f.Note(boom); n != 1 || !ok {
		t.Errorf("the first failure after a success: %d, %v; want 1, reported", n, ok)
	}
}
