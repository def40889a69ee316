// Package redisschedule publishes cron schedules' occurrences to the
// engine's stream in Redis, each exactly once across all workers
// (docs/schedules.md).
//
// When a schedule fires (schedule.Spec) and what an occurrence is
// (schedule.OccurrenceID, schedule.Envelope) are package schedule's, which
// links no Redis client. This package owns two things:
//
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
// Publisher and Scheduler are safe for concurrent use; a Scheduler runs one
// Run at a time and starts no goroutines of its own.
package redisschedule
