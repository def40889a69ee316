package stats

import "time"

// The feed is a capped stream of recent invocation outcomes of one stream
// and group (docs/delivery.md#cluster-wide-counters): every worker adds what its deliveries
// did, at most FeedBurst outcomes per flush, and relay console tails it.
// It is sampled, not a log: under load most outcomes are left out, and the
// counters, not the feed, are the numbers.
const (
	// FeedLength is about how many outcomes the feed keeps (XADD MAXLEN ~).
	FeedLength = 1000
	// FeedBurst bounds the outcomes one worker adds per flush, so the feed
	// costs Redis a bounded amount whatever the event rate.
	FeedBurst = 100
)

// Event is one invocation outcome in the feed.
type Event struct {
	// ID is the feed entry's id (set by redisstats.ReadFeed).
	ID        string
	Time      time.Time
	Consumer  string
	MessageID string
	App       string
	Handler   string
	// Outcome is what happened: "succeeded", "failed" (a retry is due),
	// "dead-lettered", or "error" (the handler could not run, or its
	// outcome was not recorded).
	Outcome string
	// Result is the handler's result label when it ran (success, failure,
	// timeout, oom, ...).
	Result      string
	Attempt     int
	MaxAttempts int
	Duration    time.Duration
	// Reason is the error's first line, or the dead-letter reason.
	Reason string
	// DLQID is the dead-letter entry of a dead-lettered outcome.
	DLQID string
}
