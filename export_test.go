package relay

import (
	"testing"
	"time"
)

// SetWriteTimeout shortens the bound of one state, DLQ or ack write for
// one test, restoring it at cleanup. Tests that use it must not run in
// parallel with others that depend on it.
func SetWriteTimeout(t testing.TB, d time.Duration) {
	old := writeTimeout.Swap(int64(d))
	t.Cleanup(func() { writeTimeout.Store(old) })
}
