// Package producer publishes events to a stream that Relay consumes
// (docs/producing.md).
//
// A Producer writes one stream entry per event with XADD: the field "event"
// holds the event's JSON object, and "traceparent" / "tracestate" carry the
// W3C trace context of the caller's span when it is valid, so the worker's
// spans continue the producer's trace (docs/observability.md#traces). The
// event is checked with matcher.DecodeEvent before anything is written, so
// an event the worker would dead-letter as malformed is refused at the
// producer instead.
//
// A Producer never trims the stream (no MAXLEN or MINID): a trim can remove
// entries no consumer group has read yet, which loses them silently
// (docs/delivery.md#missing-payloads). Retention is the workers' job
// (docs/operations.md#retention).
//
// Each XADD names one key, so a Producer works unchanged on Redis Cluster;
// the stream name needs a hash tag there ({orders}) only for the sake of the
// workers' own keys (docs/deployment.md), and for PublishOnce. A Producer
// needs no consumer group and never closes the rueidis client it is given.
//
// PublishOnce and PublishOnceJSON publish idempotently: a second publish
// with the same key within a window (24h by default, WithIdempotencyWindow)
// adds nothing and returns the first entry's id, however many publishers
// race. On Redis that is one Lua script per publish, touching the stream
// and a dedup key in the stream's hash slot
// (docs/producing.md#idempotent-publish).
//
// New takes a Stream, the one XADD a Producer needs: Redis(client, name)
// for a Redis stream, relaytest.NewStream() in tests, so that a service's
// tests publish through the same code as production. A Producer is safe
// for concurrent use when its Stream is (both of those are).
package producer
