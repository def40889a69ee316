// Package schedule turns cron schedules into occurrences in the engine's
// stream, each exactly once across all workers (docs/schedules.md).
//
// It owns four things:
//
//   - When a schedule fires. A Spec's Cron (package schedule/cron parses
//     expressions and applies Relay's DST rules) gives its firings;
//     Spec.Next, Spec.Fires and Spec.Latest wrap them with the schedule's
//     name. This package does not parse cron expressions itself, so the
//     engine, which imports it, needs no cron parser.
//   - Identity and envelope. An occurrence is
//     "schedule:<app>:<schedule>:<RFC3339 UTC instant>" (OccurrenceID); its
//     stream entry's "event" is an Envelope with source "relay.schedule".
//     IsEnvelope, DecodeEnvelope and Envelope.Validate are the consumer's
//     side: the engine in package relay routes, validates and dispatches
//     occurrences with them; Envelope.Input is the handler's stdin.
//   - Publishing. Publisher.Publish runs one Lua script that XADDs the
//     envelope and sets the dedup key relay:schedule:<app>:<schedule>:<instant>
//     (7 days) unless the key exists, so N workers publishing the same
//     occurrence write one entry. Each publish is a schedule.publish span
//     whose W3C trace context travels in the entry (traceparent,
//     tracestate).
//   - Scheduling. Scheduler.Run evaluates every schedule by the Redis
//     server's clock, publishes due occurrences, catches up the latest
//     missed firing of each schedule within 24h at start, retries failed
//     publishes (100ms, 500ms, 2s, 5s) and keeps what still fails in an
//     outbox, durable under the state directory, retried until published.
//
// It does not dispatch occurrences, pin handlers or write invocation state
// (the engine does), read templates (package relay builds Specs from
// template.yaml), or count metrics (WithObserver reports outcomes; package
// relay counts them). It reads no environment variables and never closes
// the Redis client it is given.
//
// Spec, Envelope and the package functions are pure. Publisher and
// Scheduler are safe for concurrent use; a Scheduler runs one Run at a time
// and starts no goroutines of its own.
package schedule
