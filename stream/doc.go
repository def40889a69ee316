// Package stream holds the Redis-free side of reading a stream through a
// consumer group: the Message a relay.StreamSource delivers, stream entry
// ids (ParseID, IsID, CompareID), the errors a source reports when its
// stream or group is missing (ErrNoStream, ErrNoGroup), the retention
// defaults and TrimResult (docs/delivery.md#from-entry-to-acknowledgement,
// docs/operations.md#retention).
//
// The Redis implementation is package stream/redisstream: a Source that
// reads a Redis Stream with XREADGROUP, reclaims idle entries with
// XAUTOCLAIM, heartbeats, publishes and trims. The Engine's
// acknowledgements are not the source's: the StateStore's Settle makes
// them, with the message's last transitions. This package links no Redis
// client, so the engine (package relay) uses its types without one.
package stream
