// Package redisstream reads a Redis Stream through a consumer group.
//
// A Source owns one (stream, group, consumer) triple and implements the
// delivery half of docs/delivery.md#from-entry-to-acknowledgement: it creates
// the group (MKSTREAM, from id 0), reads new entries with a short XREADGROUP
// BLOCK, reclaims idle pending entries with XAUTOCLAIM (including the ids of
// entries deleted while pending, docs/delivery.md#missing-payloads),
// publishes, and keeps live entries from being reclaimed (Heartbeat). Its
// Ack clears the references of deleted entries (Reclaim) and serves tools
// and tests: the Engine's acknowledgements are made by
// the StateStore's Settle (redisstate.Store), in the script that records a
// message's last transitions. Trim removes entries older than a retention but never one
// that any consumer group of the stream still holds pending or has not been
// delivered (docs/operations.md#retention); the caller decides how often to
// run it.
//
// The messages it returns, the entry id helpers, its errors (ErrNoGroup,
// ErrNoStream) and TrimResult are package stream's, which links no Redis
// client.
//
// It does not decide whether a message is acknowledged, retried or
// dead-lettered, and it never interprets entry fields; the delivery count it
// reports is diagnostic only. It never closes the rueidis client it is given.
//
// A Source is safe for concurrent use.
package redisstream
