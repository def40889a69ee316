// Package schedule turns cron schedules into occurrences in the engine's
// stream, each exactly once across all workers (reference.md "Schedules",
// issue #6).
//
// It owns four things:
//
//   - Occurrence math. Spec.Next, Spec.Fires and Spec.Latest evaluate a cron
//     expression (ParseCron: five fields or @hourly-style descriptors,
//     minute precision) in the schedule's IANA zone with Relay's DST rules:
//     a wall-clock time skipped by a spring-forward fires once, at the
//     instant of the jump; a wall-clock time repeated by a fall-back fires
//     once, the first time. robfig/cron parses the expressions and matches
//     wall-clock times, but its own Next drops skipped times and fires
//     repeated ones twice, so Spec maps wall-clock times to instants itself.
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
