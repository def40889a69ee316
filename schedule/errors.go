package schedule

import "errors"

// ErrInvalidEnvelope marks an occurrence envelope that must not be
// dispatched: a field is missing or malformed, its occurrence_id does not
// match its app, schedule and scheduled_at, or scheduled_at is not a firing
// of the schedule. The consumer dead-letters such entries without retrying
// (docs/schedules.md#the-stream-entry). DecodeEnvelope and Envelope.Validate
// wrap it; match it with errors.Is.
var ErrInvalidEnvelope = errors.New("schedule: invalid occurrence envelope")
