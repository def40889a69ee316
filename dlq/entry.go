package dlq

import (
	"errors"
	"time"
)

// MalformedName is the app and handler of an entry for a malformed message.
const MalformedName = "-"

// Entry is one dead-letter record: one exhausted invocation, or one malformed
// message (App and Handler MalformedName, HandlerAttempts 0). Field names on
// the wire are in docs/delivery.md#dead-letter-queue.
type Entry struct {
	// ID is the DLQ stream entry id; empty before the entry is written.
	ID              string
	OriginalStream  string
	OriginalID      string
	Group           string
	Consumer        string
	Event           string // the original "event" field, verbatim ("" if absent)
	Reason          string
	App             string
	Handler         string
	Deliveries      int64 // diagnostic PEL delivery count
	HandlerAttempts int   // real handler execution count
	Timestamp       time.Time
	Trace           string // optional trace lineage (traceparent)
}

// ErrNotFound is returned for an unknown DLQ entry id.
var ErrNotFound = errors.New("dlq: entry not found")
