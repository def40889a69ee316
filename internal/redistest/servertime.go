package redistest

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// ServerTime returns the clock of c's Redis server (TIME), to the
// microsecond: the clock that leases, PEL idle times and the stores'
// scripts run on, which a contract suite's harness reports as its Now.
// It fails the test when the reply cannot be read.
func ServerTime(t testing.TB, c rueidis.Client) time.Time {
	t.Helper()
	parts, err := c.Do(t.Context(), c.B().Time().Build()).AsStrSlice()
	if err != nil || len(parts) != 2 {
		t.Fatalf("TIME: %v, %v", parts, err)
	}
	sec, err1 := strconv.ParseInt(parts[0], 10, 64)
	usec, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("TIME: %v", parts)
	}
	return time.Unix(sec, usec*1000)
}
