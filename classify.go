package relay

import (
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
)

// class is the classify stage's result.
type class struct {
	kind classKind
	// reason says why a malformed entry is malformed.
	reason string
}

// classify is the first stage of a delivery
// (docs/delivery.md#from-entry-to-acknowledgement): it looks at the entry
// alone, before anything is counted or read from Redis.
func classify(msg stream.Message) class {
	raw, ok := msg.Fields["event"]
	switch {
	case !ok:
		return class{kind: classMalformed, reason: "message has no event field"}
	case schedule.IsEnvelope([]byte(raw)):
		return class{kind: classOccurrence}
	}
	return class{kind: classEvent}
}
