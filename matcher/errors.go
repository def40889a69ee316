package matcher

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// ErrMalformed is wrapped by DecodeEvent, Set.Match and Set.MatchAt when the
// event is not one JSON object. Such a message can never match and goes
// straight to the DLQ (docs/delivery.md#from-entry-to-acknowledgement).
var ErrMalformed = errors.New("matcher: malformed event")

// PosError is one template error with its position. Line and Col are 1-based;
// zero means the position is unknown. Path names the offending element, such
// as "events[1].pattern.status[0]"; it may be empty.
type PosError struct {
	File      string
	Line, Col int
	Path      string
	Msg       string
}

// Error formats e as "file:line:col: path: msg". The path part is left out
// when Path is empty and the line:col part when the position is unknown.
func (e *PosError) Error() string {
	s := e.File
	if e.Line > 0 {
		if s != "" {
			s += ":"
		}
		s += strconv.Itoa(e.Line) + ":" + strconv.Itoa(e.Col)
	}
	if s != "" {
		s += ": "
	}
	if e.Path != "" {
		s += e.Path + ": "
	}
	return s + e.Msg
}

// ErrorList is a list of PosErrors, sorted by position once Sort has run
// (like go/scanner.ErrorList). The zero value is an empty list ready to use.
type ErrorList []*PosError

// Add appends an error.
func (l *ErrorList) Add(file string, line, col int, path, msg string) {
	*l = append(*l, &PosError{File: file, Line: line, Col: col, Path: path, Msg: msg})
}

// Sort orders the list by file, line and column. Errors at the same position
// keep the order they were added in.
func (l ErrorList) Sort() {
	slices.SortStableFunc(l, func(a, b *PosError) int {
		return cmp.Or(
			cmp.Compare(a.File, b.File),
			cmp.Compare(a.Line, b.Line),
			cmp.Compare(a.Col, b.Col),
		)
	})
}

// Error returns the first error, followed by " (and N more errors)" when
// there are more.
func (l ErrorList) Error() string {
	switch len(l) {
	case 0:
		return "no errors"
	case 1:
		return l[0].Error()
	}
	return fmt.Sprintf("%s (and %d more errors)", l[0], len(l)-1)
}

// Unwrap returns the errors of the list, so errors.As finds a *PosError in
// an error that wraps an ErrorList.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// Err returns l as an error, or nil when l is empty.
func (l ErrorList) Err() error {
	if len(l) == 0 {
		return nil
	}
	return l
}
