// Package telemetry holds the names Relay's logs, metrics and traces share,
// so every package spells them the same way (docs/observability.md),
// and the W3C Trace Context codec for stream fields, handler environments
// and stored lineages (trace.go). It starts no exporter and reads no env.
package telemetry

// Log attribute keys.
const (
	App       = "app"
	Handler   = "handler"
	MessageID = "message_id"
	Attempt   = "attempt"
	Duration  = "duration"
	ExitCode  = "exit_code"
)
