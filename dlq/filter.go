package dlq

import "time"

// Filter selects entries in redisdlq.Store.List. Zero fields select everything.
type Filter struct {
	// App and Handler match the entry's app and handler exactly
	// (MalformedName selects malformed-message entries).
	App     string
	Handler string
	// Since keeps entries written at or after this instant, by the time in
	// the entry id (the Redis server's clock when the entry was added).
	Since time.Time
	// Limit is the most entries returned; 0 means no limit.
	Limit int
}
