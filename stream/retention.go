package stream

import "time"

// DefaultRetention is how long the source stream keeps an entry that no
// consumer group still needs (REDIS_STREAM_RETENTION,
// docs/operations.md#retention).
const DefaultRetention = 24 * time.Hour

// DefaultConsumerIdle is how long a consumer of the group must have been
// idle, with nothing pending, before redisstream.Source.PruneConsumers
// removes it.
const DefaultConsumerIdle = 24 * time.Hour

// TrimResult is what one trim of the stream did and found
// (redisstream.Source.Trim).
type TrimResult struct {
	// Trimmed is how many entries this call removed (for a counter such
	// as relay_stream_trimmed_total).
	Trimmed int64
	// Cutoff is the Redis server's time minus the retention: entries
	// added before it are due for removal.
	Cutoff time.Time
	// MinID is the XTRIM MINID bound used: every entry with a smaller id
	// is gone (unless More). "0-0" when nothing was due.
	MinID string
	// Floor is the oldest entry id some consumer group still needs; it
	// and every later entry are kept.
	Floor string
	// FloorTime is the time in Floor's id (the Unix epoch for "0-0").
	FloorTime time.Time
	// FloorGroup is the consumer group that holds Floor (the first by
	// name when several hold the same id).
	FloorGroup string
	// FloorPending reports that Floor is FloorGroup's oldest pending
	// entry (delivered, not acknowledged); otherwise Floor is its
	// last-delivered-id and what follows has not been delivered to it.
	FloorPending bool
	// HeldBack reports that FloorGroup keeps entries the retention would
	// remove: an entry it holds pending is older than Cutoff, or the
	// entry after its last delivered one is (it has not read it yet).
	// The last delivered entry alone is no holding back: it is always
	// kept, so an idle stream whose groups are all caught up is not held
	// back. Cutoff.Sub(FloorTime) says by how much; a value that keeps
	// growing is a stuck or abandoned group (docs/operations.md#retention).
	HeldBack bool
	// More reports that the call stopped at its limit
	// (redisstream.WithTrimLimit) with due entries left: call Trim again.
	More bool
}
