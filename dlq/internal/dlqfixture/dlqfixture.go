// Package dlqfixture holds the dead-letter entries that the tests of
// package dlq's codec and of its Redis store both encode, so that the two
// suites agree on what a full and a malformed entry look like.
package dlqfixture

import (
	"time"

	"github.com/relaydev/relay/dlq"
)

// Timestamp is the time of every fixture entry, with milliseconds, as the
// codec keeps them.
var Timestamp = time.Date(2026, 3, 4, 5, 6, 7, 89_000_000, time.UTC)

// Full returns an entry with every field set.
func Full() dlq.Entry {
	return dlq.Entry{
		OriginalStream:  "events",
		OriginalID:      "1700000000000-3",
		Group:           "relay",
		Consumer:        "worker-1",
		Event:           `{"event_name":"INSERT","table_name":"users"}`,
		Reason:          "exit code 3",
		App:             "billing",
		Handler:         "events.created.handler",
		Deliveries:      7,
		HandlerAttempts: 5,
		Timestamp:       Timestamp,
		Trace:           "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
}

// Malformed returns the entry of an event that is not a JSON object.
func Malformed() dlq.Entry {
	return dlq.Entry{
		OriginalStream: "events",
		OriginalID:     "1700000000000-4",
		Group:          "relay",
		Consumer:       "worker-1",
		Event:          "not json",
		Reason:         "malformed: event is not a JSON object",
		App:            dlq.MalformedName,
		Handler:        dlq.MalformedName,
		Deliveries:     1,
		Timestamp:      Timestamp,
	}
}
