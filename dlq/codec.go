package dlq

import (
	"strconv"
	"time"

	"github.com/relaydev/relay/stream"
)

// Wire field names of an entry, in the order redisdlq.Writer.Write sends
// them (docs/delivery.md#dead-letter-queue). trace is optional.
const (
	fieldOriginalStream  = "original_stream"
	fieldOriginalID      = "original_id"
	fieldGroup           = "group"
	fieldConsumer        = "consumer"
	fieldEvent           = "event"
	fieldReason          = "reason"
	fieldApp             = "app"
	fieldHandler         = "handler"
	fieldDeliveries      = "deliveries"
	fieldHandlerAttempts = "handler_attempts"
	fieldTimestamp       = "timestamp"
	fieldTrace           = "trace"
)

var fieldOrder = []string{
	fieldOriginalStream, fieldOriginalID, fieldGroup, fieldConsumer, fieldEvent, fieldReason,
	fieldApp, fieldHandler, fieldDeliveries, fieldHandlerAttempts, fieldTimestamp, fieldTrace,
}

// timestampLayout is RFC 3339 in UTC with milliseconds.
const timestampLayout = "2006-01-02T15:04:05.000Z07:00"

// Encode returns the wire fields of e. Timestamp is written in UTC with
// millisecond precision and omitted when zero; trace is omitted when empty;
// every other field is always present. e.ID is not a field. Encode does not
// validate: Entry.Validate does.
func Encode(e Entry) map[string]string {
	m := map[string]string{
		fieldOriginalStream:  e.OriginalStream,
		fieldOriginalID:      e.OriginalID,
		fieldGroup:           e.Group,
		fieldConsumer:        e.Consumer,
		fieldEvent:           e.Event,
		fieldReason:          e.Reason,
		fieldApp:             e.App,
		fieldHandler:         e.Handler,
		fieldDeliveries:      strconv.FormatInt(e.Deliveries, 10),
		fieldHandlerAttempts: strconv.Itoa(e.HandlerAttempts),
	}
	if !e.Timestamp.IsZero() {
		m[fieldTimestamp] = e.Timestamp.UTC().Format(timestampLayout)
	}
	if e.Trace != "" {
		m[fieldTrace] = e.Trace
	}
	return m
}

// EncodePairs returns the wire fields of e as Encode does, as field/value
// pairs in the order of docs/delivery.md#dead-letter-queue: what an XADD
// of the entry takes.
func EncodePairs(e Entry) []string {
	m := Encode(e)
	out := make([]string, 0, 2*len(m))
	for _, f := range fieldOrder {
		if v, ok := m[f]; ok {
			out = append(out, f, v)
		}
	}
	return out
}

// Decode builds the entry with id from its wire fields. original_id, app and
// handler are required; any other missing field decodes to its zero value,
// and unknown fields are ignored. A field that is present but unparsable
// (deliveries, handler_attempts, timestamp) or a missing required field is a
// *FieldError naming it. The Timestamp is in UTC.
func Decode(id string, fields map[string]string) (Entry, error) {
	e := Entry{
		ID:             id,
		OriginalStream: fields[fieldOriginalStream],
		OriginalID:     fields[fieldOriginalID],
		Group:          fields[fieldGroup],
		Consumer:       fields[fieldConsumer],
		Event:          fields[fieldEvent],
		Reason:         fields[fieldReason],
		App:            fields[fieldApp],
		Handler:        fields[fieldHandler],
		Trace:          fields[fieldTrace],
	}
	for _, f := range []string{fieldOriginalID, fieldApp, fieldHandler} {
		if fields[f] == "" {
			return Entry{}, &FieldError{ID: id, Field: f, Msg: "missing"}
		}
	}
	if v, ok := fields[fieldDeliveries]; ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return Entry{}, &FieldError{ID: id, Field: fieldDeliveries, Msg: "not a non-negative integer: " + strconv.Quote(v)}
		}
		e.Deliveries = n
	}
	if v, ok := fields[fieldHandlerAttempts]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return Entry{}, &FieldError{ID: id, Field: fieldHandlerAttempts, Msg: "not a non-negative integer: " + strconv.Quote(v)}
		}
		e.HandlerAttempts = n
	}
	if v, ok := fields[fieldTimestamp]; ok {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return Entry{}, &FieldError{ID: id, Field: fieldTimestamp, Msg: "not an RFC 3339 time: " + strconv.Quote(v)}
		}
		e.Timestamp = t.UTC()
	}
	return e, nil
}

// Validate reports whether e may be written (redisdlq.Writer.Write refuses it
// otherwise): every identifying field and the reason set, OriginalID a full
// stream id "<ms>-<seq>", Deliveries >= 0, and either App and Handler both
// MalformedName with HandlerAttempts 0 (a malformed message) or neither,
// with HandlerAttempts >= 0 (an exhausted invocation: 0 when no attempt
// ran, as for a message past its rule's max_age). The error is a
// *FieldError naming the field. Other implementations (relaytest's) call
// it to refuse the same entries.
func (e Entry) Validate() error {
	bad := func(field, msg string) error { return &FieldError{Field: field, Msg: msg} }
	required := []struct{ field, value string }{
		{fieldOriginalStream, e.OriginalStream},
		{fieldOriginalID, e.OriginalID},
		{fieldGroup, e.Group},
		{fieldConsumer, e.Consumer},
		{fieldReason, e.Reason},
		{fieldApp, e.App},
		{fieldHandler, e.Handler},
	}
	for _, r := range required {
		if r.value == "" {
			return bad(r.field, "empty")
		}
	}
	if !stream.IsID(e.OriginalID) {
		return bad(fieldOriginalID, "not a stream id: "+strconv.Quote(e.OriginalID))
	}
	if e.Deliveries < 0 {
		return bad(fieldDeliveries, "negative")
	}
	malformed := e.App == MalformedName
	switch {
	case malformed != (e.Handler == MalformedName):
		return bad(fieldHandler, "app and handler must both be "+strconv.Quote(MalformedName)+" or neither")
	case malformed && e.HandlerAttempts != 0:
		return bad(fieldHandlerAttempts, "must be 0 for a malformed message")
	case e.HandlerAttempts < 0:
		return bad(fieldHandlerAttempts, "negative")
	}
	return nil
}
