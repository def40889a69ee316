package redisstate

// The reserved fields of a message's hash, as package invocation lays it
// out (docs/delivery.md#data-layout-in-redis) and the scripts write them.
const (
	// terminalField marks a retained hash.
	terminalField = "__terminal"
	// matchedField says the first delivery recorded every invocation of
	// the message (invocation.Record.Complete).
	matchedField = "__matched"
	// tracePrefix starts the field of an invocation's trace lineage
	// (invocation.TraceField).
	tracePrefix = "__trace:"
	// dlqPrefix starts the field of an invocation's dead-letter entry id
	// (invocation.DLQField).
	dlqPrefix = "__dlq:"
)
