// Package dlq keeps the dead-letter queue of a source stream in Redis.
//
// The queue is the stream relay:<stream>:dlq (events.md "Dead-letter queue",
// DESIGN.md "Data layout in Redis"), one entry per exhausted invocation and
// one per malformed message. Writer appends entries and implements
// relay.DLQWriter; Store adds what the CLI needs: list with filters, get and
// delete (relay dlq ls / inspect / rm). Encode and Decode are the wire format
// of one entry, shared by both.
//
// The package does not make writes idempotent: the invocation state marker
// exhausted:<attempt>:<token>:dlq does (events.md), so the engine writes an
// entry before it records the marker and may write it again after a crash in
// between. It does not replay entries and never trims the queue. It never
// closes the rueidis client it is given.
//
// Writer and Store are safe for concurrent use.
package dlq
