package ctxtime

import (
	"context"
	"testing"
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
