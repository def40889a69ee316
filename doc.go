// Package relay is an event engine: it reads JSON events from a Redis Stream
// through a consumer group, matches each against the rules of every loaded
// app, runs each matched handler as a one-shot function, keeps durable
// per-invocation retry state, dead-letters exhausted invocations and
// acknowledges a message only when every matched invocation is terminal.
//
// An Engine wires five replaceable parts: Matcher, StreamSource, StateStore,
// Runner and DLQWriter. The production implementations live in the packages
// matcher, stream, invocation, runtime/containerd and dlq; runtime.Func runs
// Go functions in-process, for embedding without containers.
//
// Godoc cites the project's specification by file: events.md (matching,
// dispatch, retry, acknowledgement, invocation state, the DLQ),
// reference.md (templates, schedules, CLI, configuration, observability) and
// DESIGN.md (package layout, interfaces, data layout in Redis, the handler
// contract). What they promise users is written up in docs/: delivery.md,
// apps.md, schedules.md, runtimes.md, operations.md, observability.md,
// deployment.md and embedding.md. Package relaytest has in-memory fakes of
// every interface, and the contract suites they share with the real ones.
package relay
