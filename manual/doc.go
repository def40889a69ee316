// Package manual runs handlers by hand, outside the stream lifecycle:
// Invoker.Invoke runs the rules of one app that match an event (relay app
// invoke), Invoker.Replay runs a dead-letter entry's invocation once more
// (relay dlq replay). See docs/operations.md#commands. Nothing is recorded
// in invocation state; the runs are traced as the Engine's attempts are
// (docs/observability.md#traces).
package manual
