package stream

// Message is one stream entry delivered to this consumer.
//
// Fields is nil when the entry's body no longer exists in the stream (a PEL
// reference to a deleted or trimmed entry); see
// docs/delivery.md#missing-payloads.
type Message struct {
	// ID is the stream entry id, "<ms>-<seq>".
	ID string
	// Fields holds the entry's field/value pairs (for example "event",
	// "traceparent"). Later duplicates of a field name win.
	Fields map[string]string
	// Deliveries is the PEL delivery count as Redis reports it. It is
	// diagnostic only and never drives retries
	// (docs/delivery.md#attempts-retries-backoff). 0 when unknown.
	Deliveries int64
}
