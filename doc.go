// Package relay is an event engine: it reads JSON events from a Redis Stream
// through a consumer group, matches each against the rules of every loaded
// app, runs each matched handler as a one-shot function, keeps durable
// per-invocation retry state, dead-letters exhausted invocations and
// acknowledges a message only when every matched invocation is terminal.
//
// An Engine wires four replaceable parts: Matcher, StreamSource,
// StateStore and Runner (relay.go), and may keep cluster-wide counters
// (Stats). The production implementations live in the packages matcher,
// stream/redisstream, invocation/redisstate and runtime/containerd;
// runtime.Func runs Go functions in-process, for embedding without
// containers. The StateStore settles each message: one Settlement writes
// its invocations' transitions, their dead-letter entries and, once every
// invocation is terminal, its acknowledgement, atomically. This package
// imports no Redis client: package worker runs Engines on Redis as relay
// start does, and package manual runs a handler by hand.
//
// One delivery is a pipeline of stages, each taking the previous one's
// value (pipeline.go maps them; docs/architecture.md follows one message):
// decode and match in match.go (occurrence.go for a schedule occurrence),
// claim and run in attempt.go, decide and settle in settle.go, the one
// place that decides a message's acknowledgement. batch.go gathers the
// claims and settlements of concurrent deliveries into one StateStore call
// each. attempt.go asks for the retry backoff of a failed attempt
// (Config.Backoff, config.go; invocation.Backoff picks the entry), and
// later.go delivers a message again at its next step's time; of a
// handler's output the Engine keeps only the Runner's error
// (runtime.ExitError carries the last stderr line, runtime/output.go),
// which attempt.go puts into the dead-letter entry. observe.go turns every
// outcome into log lines, metrics, cluster stats and span attributes;
// reader.go, reclaimer.go and heartbeat.go are the Engine's loops,
// statsfeed.go flushes the cluster-wide counters.
//
// Godoc cites the repository's documentation by section, as
// docs/<page>.md#<heading>: docs/delivery.md (dispatch, retries,
// acknowledgement, invocation state, the DLQ, the data layout in Redis),
// docs/apps.md (templates, patterns, the handler contract),
// docs/schedules.md, docs/runtimes.md, docs/operations.md (configuration,
// the CLI, retention), docs/observability.md (traces, logs, metrics),
// docs/deployment.md and docs/embedding.md (this package's API, and where
// things are). Package relaytest has in-memory fakes of every interface,
// and the contract suites they share with the real ones.
package relay
