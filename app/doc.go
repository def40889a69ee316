// Package app models Relay's apps: an App with its event rules, schedules,
// runtime and limits, and Set, the immutable set of apps a worker serves
// (docs/apps.md). Each rule carries its flow control as a Limits value
// (concurrency, rate, debounce, maximum event age), and KeyOf reads the
// per-key limit key of an event at a FieldPath (docs/flow-control.md).
//
// It does not read templates: package app/template loads template.yaml
// files into Sets, and a service that embeds Relay can build a Set in Go
// with NewSet. Keeping YAML and cron parsing out of this package keeps them
// out of the engine, which imports it. Sets are immutable after
// construction and safe for concurrent use.
package app
