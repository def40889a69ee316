// Package redisdlq keeps the dead-letter queue of a source stream in Redis.
//
// The queue is the stream relay:<stream>:dlq
// (docs/delivery.md#dead-letter-queue,
// docs/delivery.md#data-layout-in-redis), one entry per exhausted invocation
// and one per malformed message. The Engine's entries are written by the
// StateStore's Settle (redisstate.Store.Settle), in the same step as the
// invocation's exhausted:<attempt>:<token>:dlq marker, so a redelivery, or
// a retry after a lost reply, never writes one twice, and no entry is
// written for a message no longer pending in its group
// (docs/delivery.md#invocation-state). Writer appends entries outside a
// delivery and trims the queue: Writer.Trim removes entries older than a
// retention (docs/operations.md#retention); the caller decides how often
// to run it. Store adds what the CLI needs: list with filters, get and
// delete (relay dlq ls / inspect / rm). The entries, their wire format
// (dlq.Encode, dlq.Decode) and the query types are package dlq's, which
// links no Redis client. The package does not replay entries. It never
// closes the rueidis client it is given.
//
// Writer and Store are safe for concurrent use.
package redisdlq
