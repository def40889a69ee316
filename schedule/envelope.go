package schedule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// Source is the "source" field of every occurrence envelope and of the
// handler's stdin; it is how the consumer tells Relay's own occurrences
// from external events (docs/schedules.md#the-stream-entry).
const Source = "relay.schedule"

// OccurrenceID returns the identity of one occurrence
// (docs/schedules.md#one-occurrence-however-many-workers):
// "schedule:<app>:<schedule>:<scheduled_at>", with
// scheduled_at the firing instant in RFC3339 UTC, whole seconds (any
// fraction is dropped). The dedup key is "relay:" plus the same parts, built
// by internal/keys.
func OccurrenceID(app, schedule string, at time.Time) string {
	return "schedule:" + app + ":" + schedule + ":" + FormatAt(at)
}

// FormatAt writes an occurrence instant the one way the wire accepts:
// RFC3339 in UTC, whole seconds (any fraction is dropped), as scheduled_at
// and the last part of OccurrenceID hold it.
func FormatAt(at time.Time) string {
	return at.UTC().Truncate(time.Second).Format(time.RFC3339)
}

// Envelope is the JSON object in the "event" field of a schedule
// occurrence's stream entry (docs/schedules.md#the-stream-entry):
//
//	{"source":"relay.schedule","app":"billing","schedule":"nightly",
//	 "handler":"invoice.run","scheduled_at":"2026-03-08T07:00:00Z",
//	 "occurrence_id":"schedule:billing:nightly:2026-03-08T07:00:00Z"}
//
// Handler records what the schedule named when the occurrence was
// published; the consumer dispatches to the handler configured (or pinned)
// for the schedule, so a changed handler does not make an envelope invalid.
type Envelope struct {
	Source       string `json:"source"`
	App          string `json:"app"`
	Schedule     string `json:"schedule"`
	Handler      string `json:"handler"`
	ScheduledAt  string `json:"scheduled_at"`
	OccurrenceID string `json:"occurrence_id"`
}

// NewEnvelope returns the envelope of the occurrence of s at the instant at.
func NewEnvelope(s Spec, at time.Time) Envelope {
	return Envelope{
		Source:       Source,
		App:          s.App,
		Schedule:     s.Name,
		Handler:      s.Handler,
		ScheduledAt:  FormatAt(at),
		OccurrenceID: OccurrenceID(s.App, s.Name, at),
	}
}

// Marshal returns the envelope as compact JSON, fields in wire order.
func (e Envelope) Marshal() []byte {
	b, err := json.Marshal(e)
	if err != nil {
		// Six string fields always marshal.
		panic("schedule: marshal envelope: " + err.Error())
	}
	return b
}

// Time returns ScheduledAt as an instant. It fails unless ScheduledAt is
// RFC3339 in UTC with whole seconds, exactly as OccurrenceID writes it.
func (e Envelope) Time() (time.Time, error) {
	return parseAt(e.ScheduledAt)
}

func parseAt(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil || FormatAt(t) != s {
		return time.Time{}, fmt.Errorf("%w: field \"scheduled_at\" is %q, want an RFC3339 UTC time with whole seconds such as \"2026-03-08T07:00:00Z\"", ErrInvalidEnvelope, s)
	}
	return t.UTC(), nil
}

// envelopeFields lists the envelope's keys in wire order, for DecodeEnvelope.
var envelopeFields = []string{"source", "app", "schedule", "handler", "scheduled_at", "occurrence_id"}

// IsEnvelope reports whether event is a JSON object whose top-level
// "source" key (exact spelling) holds the string "relay.schedule". It is the
// consumer's routing test: anything claiming that source takes the schedule
// path and is validated there, so an external event cannot bypass
// validation by imitating an envelope. It does not check other fields.
func IsEnvelope(event []byte) bool {
	// Fast path for ordinary events: without the literal or an escape
	// sequence that could spell it, the source cannot be relay.schedule.
	if !bytes.Contains(event, []byte(Source)) && bytes.IndexByte(event, '\\') < 0 {
		return false
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(event, &obj); err != nil {
		return false
	}
	var src string
	return json.Unmarshal(obj["source"], &src) == nil && src == Source
}

// DecodeEnvelope parses an occurrence envelope strictly: event must be a
// JSON object in which every envelope field is present with a non-empty
// string value, source is "relay.schedule", and scheduled_at is RFC3339 UTC
// with whole seconds. Unknown fields are ignored, so a newer publisher can
// add fields during a rolling upgrade. Keys match exactly (not
// case-insensitively, unlike encoding/json's struct decoding).
//
// Errors wrap ErrInvalidEnvelope and name the offending field. DecodeEnvelope
// does not compare the fields with each other or with a schedule: that is
// Validate.
func DecodeEnvelope(event []byte) (Envelope, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(event, &obj); err != nil || obj == nil {
		return Envelope{}, fmt.Errorf("%w: event is not a JSON object", ErrInvalidEnvelope)
	}
	vals := make(map[string]string, len(envelopeFields))
	for _, name := range envelopeFields {
		raw, ok := obj[name]
		if !ok {
			return Envelope{}, fmt.Errorf("%w: field %q is missing", ErrInvalidEnvelope, name)
		}
		// Unmarshal would turn null into "" without complaint.
		var v string
		if b := bytes.TrimSpace(raw); len(b) == 0 || b[0] != '"' || json.Unmarshal(b, &v) != nil {
			return Envelope{}, fmt.Errorf("%w: field %q must be a string, got %s", ErrInvalidEnvelope, name, jsonKind(raw))
		}
		if v == "" {
			return Envelope{}, fmt.Errorf("%w: field %q is empty", ErrInvalidEnvelope, name)
		}
		vals[name] = v
	}
	e := Envelope{
		Source:       vals["source"],
		App:          vals["app"],
		Schedule:     vals["schedule"],
		Handler:      vals["handler"],
		ScheduledAt:  vals["scheduled_at"],
		OccurrenceID: vals["occurrence_id"],
	}
	if e.Source != Source {
		return Envelope{}, fmt.Errorf("%w: field \"source\" is %q, want %q", ErrInvalidEnvelope, e.Source, Source)
	}
	if _, err := e.Time(); err != nil {
		return Envelope{}, err
	}
	return e, nil
}

// jsonKind names the JSON type of a raw value, for error messages.
func jsonKind(raw json.RawMessage) string {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '"':
		return "an invalid string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// Validate checks that e is a genuine occurrence of s, as the consumer must
// before dispatching it (docs/schedules.md#the-stream-entry): source is
// "relay.schedule", app and schedule name s, occurrence_id equals
// OccurrenceID(app, schedule, scheduled_at), and scheduled_at is a firing
// instant of s's current cron expression in its zone (Spec.Fires). The
// handler field is not compared: the schedule's configured handler wins.
//
// Every mismatch wraps ErrInvalidEnvelope and names the field. A failure to
// evaluate s itself (an unparsable cron) is returned unwrapped, since that
// is the template's fault, not the envelope's.
func (e Envelope) Validate(s Spec) error {
	if e.Source != Source {
		return fmt.Errorf("%w: field \"source\" is %q, want %q", ErrInvalidEnvelope, e.Source, Source)
	}
	if e.App != s.App {
		return fmt.Errorf("%w: field \"app\" is %q, want %q", ErrInvalidEnvelope, e.App, s.App)
	}
	if e.Schedule != s.Name {
		return fmt.Errorf("%w: field \"schedule\" is %q, want %q", ErrInvalidEnvelope, e.Schedule, s.Name)
	}
	at, err := e.Time()
	if err != nil {
		return err
	}
	if want := OccurrenceID(e.App, e.Schedule, at); e.OccurrenceID != want {
		return fmt.Errorf("%w: field \"occurrence_id\" is %q, want %q", ErrInvalidEnvelope, e.OccurrenceID, want)
	}
	ok, err := s.Fires(at)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: field \"scheduled_at\" %s is not a firing of cron %q in %s", ErrInvalidEnvelope, e.ScheduledAt, s.Cron, zoneName(s.Cron.Location()))
	}
	return nil
}

func zoneName(loc *time.Location) string {
	if loc == nil {
		return "UTC"
	}
	return loc.String()
}

// Input returns the handler's stdin for this occurrence
// (docs/schedules.md#what-the-handler-receives):
// {"source":"relay.schedule","schedule":...,"scheduled_at":...}.
func (e Envelope) Input() []byte {
	b, err := json.Marshal(struct {
		Source      string `json:"source"`
		Schedule    string `json:"schedule"`
		ScheduledAt string `json:"scheduled_at"`
	}{Source, e.Schedule, e.ScheduledAt})
	if err != nil {
		panic("schedule: marshal input: " + err.Error())
	}
	return b
}
