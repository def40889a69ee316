package dlq

import (
	"errors"
	"strconv"
)

// ErrInvalidEntry reports an entry that cannot be written or read back;
// the error is a *FieldError that names the field.
var ErrInvalidEntry = errors.New("dlq: invalid entry")

// FieldError is an invalid field of an entry, found by
// redisdlq.Writer.Write before writing or by Decode when reading. It matches ErrInvalidEntry with errors.Is.
type FieldError struct {
	// ID is the entry id; empty for an entry not written yet.
	ID string
	// Field is the wire field name, for example "handler_attempts".
	Field string
	// Msg says what is wrong with it.
	Msg string
}

func (e *FieldError) Error() string {
	s := "dlq: "
	if e.ID != "" {
		s += "entry " + e.ID + ": "
	}
	return s + "field " + strconv.Quote(e.Field) + ": " + e.Msg
}

// Unwrap returns ErrInvalidEntry.
func (e *FieldError) Unwrap() error { return ErrInvalidEntry }
