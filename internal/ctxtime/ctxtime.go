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
