package invocation

import (
	"slices"
	"strings"
)

// terminalField is the reserved hash field that marks a retained hash.
const terminalField = "__terminal"

// matchedField is the reserved hash field that says the first delivery
// recorded every invocation of the message (Record.Complete).
const matchedField = "__matched"

// tracePrefix starts the reserved field holding an invocation's trace
// lineage (settle.lua).
const tracePrefix = "__trace:"

// DLQField returns the reserved hash field that holds the id of the
// dead-letter entry of invocation field ("<app>/<handler>"):
// "__dlq:<app>/<handler>", written by Settle with the entry, so a reader of
// the message's state (the console) finds it. It lives as long as the
// hash: with retention 0 only the entry itself outlives the XACK.
func DLQField(field string) string { return dlqPrefix + field }

// dlqPrefix starts the reserved field holding an invocation's dead-letter
// entry id.
const dlqPrefix = "__dlq:"

// TraceField returns the reserved hash field that holds the trace lineage of
// invocation field ("<app>/<handler>"): "__trace:<app>/<handler>". It is
// written by the Retry, Exhaust and Release transitions from Lease.Trace.
// Code that reads the whole hash (Get) must skip every field starting with
// "__": those are not invocations.
func TraceField(field string) string { return tracePrefix + field }

// UnfinishedOf reads Unfinished from the fields of a message's hash, as
// redisstate.Store.Unfinished does; other StateStores call it on their own
// copy.
func UnfinishedOf(m map[string]string) Unfinished {
	if _, ok := m[terminalField]; ok {
		return Unfinished{}
	}
	var u Unfinished
	for f, v := range m {
		if strings.HasPrefix(f, "__") || Final(v) {
			continue
		}
		u.Fields = append(u.Fields, f)
	}
	slices.Sort(u.Fields)
	u.Complete = m[matchedField] == "1"
	return u
}

// SupersededPrefix starts the final value of an invocation a newer event
// with its debounce key superseded: "superseded:<newer message id>"
// (docs/delivery.md#data-layout-in-redis).
const SupersededPrefix = "superseded:"

// Final reports whether v, a stored invocation value, is final: "ok",
// exhausted with its dead-letter entry written (":dlq"), or superseded.
func Final(v string) bool {
	return v == "ok" || strings.HasPrefix(v, "exhausted:") && strings.HasSuffix(v, ":dlq") || strings.HasPrefix(v, SupersededPrefix)
}
