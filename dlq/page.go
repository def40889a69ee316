package dlq

import (
	"errors"
	"time"
)

// Defaults of PageQuery.
const (
	// DefaultPageCount is how many entries a page holds.
	DefaultPageCount = 50
	// DefaultPageScan is the most raw entries one Page call reads: with a
	// filter that few entries pass, a page comes back short (or empty) with
	// a Next cursor rather than walking a stream of millions in one call.
	DefaultPageScan = 2000
)

// PageQuery selects one page of entries for redisdlq.Store.Page.
type PageQuery struct {
	// Filter selects by app, handler and Since as in List; its Limit is
	// ignored (Count bounds a page).
	Filter
	// HandlerPrefix keeps entries whose handler starts with this text,
	// ignoring case.
	HandlerPrefix string
	// Reason keeps entries whose reason contains this text, ignoring case.
	Reason string
	// Text keeps entries whose event contains this text, ignoring case.
	Text string
	// Before keeps entries written before this instant, by the time in the
	// entry id (an "older than" age); zero keeps all.
	Before time.Time
	// Newest pages from the newest entry back (XREVRANGE) rather than from
	// the oldest forward.
	Newest bool
	// After is the cursor: the Next of the previous page, in the page's
	// direction. "" starts at the oldest entry (or at Since), or with
	// Newest at the newest (or before Before).
	After string
	// Count is the most entries returned (DefaultPageCount when 0).
	Count int
	// Scan is the most raw entries read (DefaultPageScan when 0, at least
	// Count).
	Scan int
}

// Filtered reports whether q selects by anything at all: a filtered count
// must be counted (redisdlq.Store.Count), an unfiltered one is the stream's length.
func (q PageQuery) Filtered() bool {
	return q.App != "" || q.Handler != "" || q.HandlerPrefix != "" || q.Reason != "" || q.Text != "" ||
		!q.Since.IsZero() || !q.Before.IsZero()
}

// Page is one page of dead-letter entries, in the query's order.
type Page struct {
	Entries []Entry
	// Undecodable lists the entries in the scanned range that Decode
	// rejected (each a *FieldError naming its id), when no app, handler,
	// reason or text filter is set: they can still be inspected and
	// removed by id.
	Undecodable []error
	// Next is the cursor of the following page, "" when the range is
	// exhausted. A page shorter than Count with a Next means the scan
	// budget ran out before Count entries passed the filter.
	Next string
	// Scanned is how many raw entries were read.
	Scanned int
}

// IsUndecodable reports whether err is an entry that Decode rejected, and
// returns its id.
func IsUndecodable(err error) (id string, ok bool) {
	var fe *FieldError
	if errors.As(err, &fe) && fe.ID != "" {
		return fe.ID, true
	}
	return "", false
}
