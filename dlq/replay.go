package dlq

import "time"

// Replay results a replay history records (Replays.LastResult).
const (
	// ReplayFailed: the handler ran and failed, or could not be run.
	ReplayFailed = "failed"
	// ReplayRefused: the entry cannot be replayed as it is (a malformed
	// message, a handler gone, an app unavailable).
	ReplayRefused = "refused"
)

// Replays is the replay history of one entry: how often it was replayed
// without success, and the last such replay. A successful replay deletes
// the entry and its history (redisdlq.Store.Delete). The zero value is an entry never
// replayed.
type Replays struct {
	Count      int64
	LastAt     time.Time
	LastResult string // ReplayFailed or ReplayRefused
	LastError  string
}
