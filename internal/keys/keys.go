// Package keys builds every Redis key name Relay uses. It is the only place
// that spells the "relay:" prefix (DESIGN.md "Data layout in Redis", a wire
// contract that other tools read).
package keys

import (
	"strings"
	"time"
)

const prefix = "relay:"

var escaper = strings.NewReplacer("%", "%25", ":", "%3A")

// Escape percent-escapes ':' and '%' so a name cannot forge key segments.
func Escape(s string) string { return escaper.Replace(s) }

// Invocation is the per-message invocation hash:
// relay:invocation:<stream>:<group>:<message-id>.
func Invocation(stream, group, messageID string) string {
	return prefix + "invocation:" + Escape(stream) + ":" + Escape(group) + ":" + Escape(messageID)
}

// DLQ is the dead-letter stream of a source stream: relay:<stream>:dlq.
func DLQ(stream string) string { return prefix + stream + ":dlq" }

// ScheduleOccurrence is the dedup key of one schedule occurrence:
// relay:schedule:<app>:<schedule>:<RFC3339 UTC instant, whole seconds>.
func ScheduleOccurrence(app, schedule string, at time.Time) string {
	return prefix + "schedule:" + app + ":" + schedule + ":" + at.UTC().Truncate(time.Second).Format(time.RFC3339)
}

// Stats is the hash of cluster-wide counters for one stream and group.
func Stats(stream, group string) string {
	return prefix + "stats:" + Escape(stream) + ":" + Escape(group)
}
