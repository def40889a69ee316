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
// The behaviour follows spec/events.md; see docs/ for a tour.
package relay
