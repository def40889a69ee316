package invocation

import "time"

// DefaultRetries is how many times a failed invocation is retried when its
// rule sets no retries: 4, so at most 5 attempts
// (docs/delivery.md#attempts-retries-backoff).
const DefaultRetries = 4

// DefaultRetention is how long a message's hash is kept after the message
// left the PEL: 48 hours (REDIS_INVOCATION_RETENTION,
// docs/delivery.md#invocation-state). A retention of 0 deletes the hash
// with the XACK instead (CheckRetention).
const DefaultRetention = 48 * time.Hour

// DefaultBackoff is the fixed retry schedule of
// docs/delivery.md#attempts-retries-backoff: 1m, 2m, 5m, then 10m capped.
// Read-only; copy it to change it.
var DefaultBackoff = []time.Duration{time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute}

// Backoff returns the wait after attempt failedAttempt (1-based) failed:
// schedule[failedAttempt-1], capped at the last entry of schedule. An attempt
// below 1 counts as 1; an empty schedule means no wait.
func Backoff(schedule []time.Duration, failedAttempt int) time.Duration {
	if len(schedule) == 0 {
		return 0
	}
	i := min(max(failedAttempt, 1), len(schedule)) - 1
	return schedule[i]
}
