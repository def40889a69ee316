package relaytest

import (
	"sync"
	"time"
)

// Clock is the time source of a fake: what the Redis server's TIME is to
// the Redis implementations. Leases, backoffs, retention TTLs, PEL idle
// times and stream entry ids are all read from it. Implementations must be
// safe for concurrent use.
type Clock interface {
	Now() time.Time
}

// SystemClock is the default Clock: time.Now. Inside a testing/synctest
// bubble that is the bubble's fake time.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// ManualClock is a Clock that moves only when told to, for tests that step
// through leases and backoffs without waiting. Time never goes backwards:
// Advance ignores a negative d. Safe for concurrent use.
//
// Only the fakes read a ManualClock. An Engine's own timers (reclaim and
// heartbeat intervals, concurrency wait, shutdown timeout) run on real
// time, or on the bubble's time inside a testing/synctest bubble. In a
// bubble the default SystemClock moves the fakes with the Engine; a
// ManualClock keeps them apart, as the Redis server's clock and a worker's
// are, so a test can let the worker's time pass while the server's stands
// still (package relay's TestFakesRetryWaitsForTheServersClock).
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock returns a ManualClock that reads start until advanced.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{now: start}
}

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (ignored when d <= 0) and returns
// the new time.
func (c *ManualClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.now = c.now.Add(d)
	}
	return c.now
}

// nowMS returns c's time in Unix milliseconds: the fakes keep every time at
// the millisecond precision the Redis implementations store.
func nowMS(c Clock) int64 { return c.Now().UnixMilli() }
