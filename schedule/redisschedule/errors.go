package redisschedule

import "errors"

// ErrRunning is returned by Scheduler.Run when the Scheduler is already
// running: one Scheduler runs one loop at a time.
var ErrRunning = errors.New("schedule: scheduler is already running")
