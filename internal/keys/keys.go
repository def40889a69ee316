// Package keys builds every Redis key name Relay uses. It is the only place
// that spells the "relay:" prefix (docs/delivery.md#data-layout-in-redis, a
// wire contract that other tools read).
package keys

import (
	"strings"
	"time"
)

const prefix = "relay:"

// Pattern is a SCAN MATCH glob for every key under Relay's prefix: all
// its keys but the source streams, which are the producers'.
const Pattern = prefix + "*"

var escaper = strings.NewReplacer("%", "%25", ":", "%3A")

// Escape percent-escapes ':' and '%' so a name cannot forge key segments.
func Escape(s string) string { return escaper.Replace(s) }

// Invocation is the per-message invocation hash:
// relay:invocation:<stream>:<group>:<message-id>.
func Invocation(stream, group, messageID string) string {
	return prefix + "invocation:" + Escape(stream) + ":" + Escape(group) + ":" + Escape(messageID)
}

// InvocationPattern is a SCAN MATCH glob for every invocation hash of
// stream and group: the prefix of Invocation with the glob's special
// characters ('*', '?', '[', ']', '\') backslash-escaped, then "*".
func InvocationPattern(stream, group string) string {
	return globEscaper.Replace(Invocation(stream, group, "")) + "*"
}

var globEscaper = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)

// InvocationMessageID returns the message id of key, an invocation hash
// of stream and group, and whether key is one: false for any other key,
// and for one whose id part would not be built back into key.
func InvocationMessageID(stream, group, key string) (string, bool) {
	id, ok := strings.CutPrefix(key, Invocation(stream, group, ""))
	if !ok || id == "" || Invocation(stream, group, id) != key {
		return "", false
	}
	return id, true
}

// DLQ is the dead-letter stream of a source stream: relay:<stream>:dlq.
func DLQ(stream string) string { return prefix + stream + ":dlq" }

// LegacyDLQWritten is the marker a worker of the previous version of
// Relay wrote once the dead-letter entry of one invocation was written,
// holding the entry's id:
// relay:<stream>:dlq:written:<group>:<message-id>:<app>/<handler>. This
// version writes none; its dead-letter transition reads one, so that it
// takes over an invocation the previous version left exhausted, entry
// written but not marked, without writing the entry twice. The markers
// expire on the TTL they were written with.
func LegacyDLQWritten(stream, group, messageID, app, handler string) string {
	return DLQ(stream) + ":written:" + Escape(group) + ":" + Escape(messageID) + ":" + Escape(app) + "/" + Escape(handler)
}

// DLQReplays is the replay history of one dead-letter entry, a hash:
// relay:<stream>:dlq:replays:<entry-id>. It shares the DLQ stream's hash
// tag.
func DLQReplays(stream, entryID string) string {
	return DLQ(stream) + ":replays:" + Escape(entryID)
}

// ScheduleOccurrence is the dedup key of one occurrence of a schedule that
// publishes into stream:
// relay:schedule:<app>:<schedule>:<RFC3339 UTC instant, whole seconds>.
// When stream carries a Redis Cluster hash tag ("{orders}"), the tag is
// inserted after "schedule:" so the key shares the stream's hash slot and
// the publish script, which touches both, stays within one slot.
func ScheduleOccurrence(stream, app, schedule string, at time.Time) string {
	tag := ""
	if t, ok := HashTag(stream); ok {
		tag = "{" + t + "}:"
	}
	return prefix + "schedule:" + tag + app + ":" + schedule + ":" + at.UTC().Truncate(time.Second).Format(time.RFC3339)
}

// Idempotency is the dedup key of one idempotent publish into stream (a
// string holding the id of the entry the first publish with key added,
// docs/producing.md#idempotent-publish):
// relay:idempotency:<stream>:<key>, stream and key percent-escaped. When
// stream carries a Redis Cluster hash tag ("{orders}"), the tag is
// inserted after "idempotency:" so the key shares the stream's hash slot
// and the publish script, which touches both, stays within one slot; the
// tag comes first, so braces in key cannot move the slot.
func Idempotency(stream, key string) string {
	tag := ""
	if t, ok := HashTag(stream); ok {
		tag = "{" + t + "}:"
	}
	return prefix + "idempotency:" + tag + Escape(stream) + ":" + Escape(key)
}

// Feed is the capped stream of recent invocation outcomes of one stream
// and group, which relay console tails: relay:feed:<stream>:<group>.
func Feed(stream, group string) string {
	return prefix + "feed:" + Escape(stream) + ":" + Escape(group)
}

// HashTag returns the Redis Cluster hash tag of key: the text between the
// first '{' and the first '}' after it, when that text is not empty. Only
// that text is hashed, so keys with the same tag share a slot.
func HashTag(key string) (string, bool) {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return "", false
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return "", false
	}
	return key[open+1 : open+1+end], true
}

// Limit is the key of one flow-control group of the rule of invocation
// field ("<app>/<handler>") of stream and group
// (docs/flow-control.md): relay:limit:<stream>:<group>:<kind>:<field>:<limit key>,
// kind "slots" (a sorted set of the running attempts' message ids, scored
// by their leases' ends), "rate" (the GCRA's theoretical arrival time) or
// "debounce" (a hash of the latest event's id and the end of its period).
// It shares the stream's hash tag.
func Limit(stream, group, kind, field, limitKey string) string {
	return prefix + "limit:" + Escape(stream) + ":" + Escape(group) + ":" + kind + ":" + Escape(field) + ":" + Escape(limitKey)
}

// IsSlots reports whether key is a Limit key of kind "slots", a sorted
// set. Stream, group and field are escaped in a Limit key, so ":slots:"
// after the prefix can only be its kind.
func IsSlots(key string) bool {
	rest, ok := strings.CutPrefix(key, prefix+"limit:")
	return ok && strings.Contains(rest, ":slots:")
}

// Stats is the hash of cluster-wide counters for one stream and group.
func Stats(stream, group string) string {
	return prefix + "stats:" + Escape(stream) + ":" + Escape(group)
}

// Status is the hash of the workers' hold status for one stream and group:
// one field per consumer, its JSON status (stats.WorkerStatus).
func Status(stream, group string) string {
	return prefix + "status:" + Escape(stream) + ":" + Escape(group)
}
