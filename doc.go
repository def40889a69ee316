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
// Godoc cites the repository's documentation by section, as
// docs/<page>.md#<heading>: docs/delivery.md (dispatch, retries,
// acknowledgement, invocation state, the DLQ, the data layout in Redis),
// docs/apps.md (templates, patterns, the handler contract),
// docs/schedules.md, docs/runtimes.md, docs/operations.md (configuration,
// the CLI, retention), docs/observability.md (traces, logs, metrics),
// docs/deployment.md and docs/embedding.md (this package's API). Package
// relaytest has in-memory fakes of every interface, and the contract suites
// they share with the real ones.
package relay
