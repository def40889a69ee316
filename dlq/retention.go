package dlq

import (
	"strconv"
	"strings"
	"time"

	"github.com/relaydev/relay/stream"
)

// DefaultRetention is how long the dead-letter stream keeps an entry: 14
// days (REDIS_DLQ_RETENTION, docs/operations.md#retention).
const DefaultRetention = 14 * 24 * time.Hour

// TrimResult is what one trim of the dead-letter stream did
// (redisdlq.Writer.Trim).
type TrimResult struct {
	// Trimmed is how many entries this call removed (for a counter).
	Trimmed int64
	// Cutoff is the Redis server's time minus the retention: entries
	// written before it are gone, unless More.
	Cutoff time.Time
	// More reports that the call stopped at its internal bound with
	// expired entries left: call Trim again.
	More bool
}

// Expires returns when retention removes the entry: the time in its id
// plus retention. The zero time when retention is 0 (kept forever) or the
// id is not a stream id.
func (e Entry) Expires(retention time.Duration) time.Time {
	if retention <= 0 || !stream.IsID(e.ID) {
		return time.Time{}
	}
	ms, _, _ := strings.Cut(e.ID, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(n).Add(retention)
}
