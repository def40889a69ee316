package relay

import (
	"fmt"
	"strings"

	"github.com/relaydev/relay/schedule"
	"github.com/relaydev/relay/stream"
)

// classKind is what a stream entry is.
type classKind int

const (
	// classEvent: an external event, to be matched against the apps' rules.
	// Whether its "event" field holds a JSON object is the Matcher's to say.
	classEvent classKind = iota
	// classOccurrence: one of Relay's own schedule occurrences, dispatched
	// straight to its schedule's handler (docs/schedules.md#the-stream-entry).
	classOccurrence
	// classMalformed: an entry that can never succeed; it is dead-lettered
	// once, without running a handler.
	classMalformed
	// classOversized: an event larger than Config.MaxEventBytes; it is
	// dead-lettered once, undecoded, with a summary in place of its payload.
	classOversized
)

// class is the classify stage's result.
type class struct {
	kind classKind
	// reason says why a malformed or oversized entry can never succeed.
	reason string
	// summary stands in for an oversized event's payload in its DLQ entry.
	summary string
}

// classify is the first stage of a delivery
// (docs/delivery.md#from-entry-to-acknowledgement): it looks at the entry
// alone, before anything is counted or read from Redis. An event larger than
// maxEventBytes (> 0) is not looked into at all.
func classify(msg stream.Message, maxEventBytes int) class {
	raw, ok := msg.Fields["event"]
	switch {
	case !ok:
		return class{kind: classMalformed, reason: "message has no event field"}
	case maxEventBytes > 0 && len(raw) > maxEventBytes:
		return class{kind: classOversized, reason: fmt.Sprintf("event is %d bytes, larger than the limit of %d (MAX_EVENT_BYTES)", len(raw), maxEventBytes),
			summary: oversizedSummary(raw, maxEventBytes)}
	case mayBeEnvelope(raw) && schedule.IsEnvelope([]byte(raw)):
		return class{kind: classOccurrence}
	}
	return class{kind: classEvent}
}

// mayBeEnvelope is the test schedule.IsEnvelope starts with, on the string:
// an event without the source literal or an escape sequence that could
// spell it is no envelope, and is not copied to find that out.
func mayBeEnvelope(raw string) bool {
	return strings.Contains(raw, schedule.Source) || strings.IndexByte(raw, '\\') >= 0
}

// summaryPrefix is how much of an oversized event its summary shows.
const summaryPrefix = 200

// oversizedSummary is what a DLQ entry holds in place of an oversized
// event: its size, the limit, and its first bytes as text, so an operator
// can tell which event it was without the payload being copied again.
func oversizedSummary(raw string, limit int) string {
	head := raw[:min(len(raw), summaryPrefix)]
	return fmt.Sprintf("(oversized event: %d bytes, over the limit of %d; the entry stays in the stream until retention removes it; it begins: %s…)",
		len(raw), limit, strings.ToValidUTF8(head, "\ufffd"))
}
