// Package schedule says when cron schedules fire and what their
// occurrences in the engine's stream are (docs/schedules.md).
//
// It owns two things:
//
//   - When a schedule fires. A Spec's Cron (package schedule/cron parses
//     expressions and applies Relay's DST rules) gives its firings;
//     Spec.Next, Spec.Fires and Spec.Latest wrap them with the schedule's
//     name. This package does not parse cron expressions itself, so the
//     engine, which imports it, needs no cron parser.
//   - Identity and envelope. An occurrence is
//     "schedule:<app>:<schedule>:<RFC3339 UTC instant>" (OccurrenceID,
//     FormatAt); its stream entry's "event" is an Envelope with source
//     "relay.schedule". IsEnvelope, DecodeEnvelope and Envelope.Validate are
//     the consumer's side: the engine in package relay routes, validates
//     and dispatches occurrences with them; Envelope.Input is the handler's
//     stdin.
//
// Publishing occurrences exactly once across all workers and scheduling
// them by the Redis server's clock, with an outbox for what fails, is
// package schedule/redisschedule (Publisher, Scheduler). This package
// links no Redis client and is pure.
package schedule
