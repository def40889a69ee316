package relay

import "errors"

// Sentinels of Invoke and Replay, for callers that branch on why nothing
// ran. Each is wrapped with the app, handler or entry it concerns.
var (
	// ErrAppUnavailable: the app's template has errors, so none of its
	// handlers may run (events.md "Delivery, retry, and ACK").
	ErrAppUnavailable = errors.New("relay: app unavailable")
	// ErrReplayMalformed: the dead-letter entry records a malformed message
	// (app and handler "-"); it has no handler to run again.
	ErrReplayMalformed = errors.New("relay: a malformed-message entry cannot be replayed")
	// ErrHandlerGone: the app named by a dead-letter entry is no longer
	// loaded, or has no event rule with the entry's handler any more.
	ErrHandlerGone = errors.New("relay: handler no longer exists")
)
