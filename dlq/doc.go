// Package dlq keeps the dead-letter queue of a source stream in Redis.
//
// The queue is the stream relay:<stream>:dlq
// (docs/delivery.md#dead-letter-queue,
// docs/delivery.md#data-layout-in-redis), one entry per exhausted invocation
// and one per malformed message. Writer appends entries and implements
// relay.DLQWriter; Store adds what the CLI needs: list with filters, get and
// delete (relay dlq ls / inspect / rm). Encode and Decode are the wire format
// of one entry, shared by both.
//
// Writes are idempotent per invocation (original message id, app and
// handler): Writer records the id of the first entry beside the queue, so
// overlapping deliveries of an exhausted invocation, or a retry after a crash
// between the write and the invocation's exhausted:<attempt>:<token>:dlq
// marker, leave one entry. A Writer WithPELFence, as the Worker builds it,
// also writes nothing for a message no longer pending in its group
// (docs/delivery.md#invocation-state). Writer.Trim removes entries older than a
// retention (docs/operations.md#retention); the caller decides how often
// to run it. The package does not replay entries. It never closes the
// rueidis client it is given.
//
// Writer and Store are safe for concurrent use.
package dlq
