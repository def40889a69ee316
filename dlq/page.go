package dlq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/relaydev/relay/stream"
)

// Defaults of PageQuery.
const (
	// DefaultPageCount is how many entries a page holds.
	DefaultPageCount = 50
	// DefaultPageScan is the most raw entries one Page call reads: with a
	// filter that few entries pass, a page comes back short (or empty) with
	// a Next cursor rather than walking a stream of millions in one call.
	DefaultPageScan = 2000
	// pageBatch is how many entries one XRANGE of Page reads.
	pageBatch = 200
)

// PageQuery selects one page of entries for Store.Page.
type PageQuery struct {
	// Filter selects by app, handler and Since as in List; its Limit is
	// ignored (Count bounds a page).
	Filter
	// Reason keeps entries whose reason contains this text, ignoring case.
	Reason string
	// Before keeps entries written before this instant, by the time in the
	// entry id (an "older than" age); zero keeps all.
	Before time.Time
	// After is the cursor: the Next of the previous page. "" starts at the
	// oldest entry (or at Since).
	After string
	// Count is the most entries returned (DefaultPageCount when 0).
	Count int
	// Scan is the most raw entries read (DefaultPageScan when 0, at least
	// Count).
	Scan int
}

// Page is one page of dead-letter entries, oldest first.
type Page struct {
	Entries []Entry
	// Undecodable lists the entries in the scanned range that Decode
	// rejected (each a *FieldError naming its id), when no app, handler
	// or reason filter is set: they can still be inspected and removed by id.
	Undecodable []error
	// Next is the cursor of the following page, "" when the range is
	// exhausted. A page shorter than Count with a Next means the scan
	// budget ran out before Count entries passed the filter.
	Next string
	// Scanned is how many raw entries were read.
	Scanned int
}

// Page returns up to q.Count entries that pass q, oldest first, starting
// after q.After. It reads the stream with XRANGE ... COUNT in batches and
// never more than q.Scan entries, so its cost is bounded whatever the
// length of the stream; it never loads the whole stream.
func (s *Store) Page(ctx context.Context, q PageQuery) (Page, error) {
	count, scan := q.Count, q.Scan
	if count < 0 || scan < 0 {
		return Page{}, fmt.Errorf("dlq: page: Count and Scan must be >= 0, got %d and %d", count, scan)
	}
	if count == 0 {
		count = DefaultPageCount
	}
	if scan == 0 {
		scan = DefaultPageScan
	}
	scan = max(scan, count)
	start := "-"
	switch {
	case q.After != "":
		ms, seq, err := stream.ParseID(q.After)
		if err != nil {
			return Page{}, fmt.Errorf("dlq: page: cursor %q is not a stream id", q.After)
		}
		if ms == math.MaxUint64 && seq == math.MaxUint64 {
			return Page{}, nil // no id follows it; Redis refuses "(" before it
		}
		start = "(" + q.After
	case !q.Since.IsZero():
		start = strconv.FormatInt(max(q.Since.UnixMilli(), 0), 10)
	}
	end := "+"
	if !q.Before.IsZero() {
		ms := q.Before.UnixMilli() - 1
		if ms < 0 {
			return Page{}, nil
		}
		end = strconv.FormatInt(ms, 10)
		if !q.Since.IsZero() && q.Since.UnixMilli() > ms {
			return Page{}, nil
		}
	}
	// A cursor before Since (the filter changed between pages) must not
	// widen the range.
	if q.After != "" && !q.Since.IsZero() {
		if ms, _, _ := strings.Cut(q.After, "-"); ms != "" {
			if n, err := strconv.ParseUint(ms, 10, 64); err == nil && int64(n) < q.Since.UnixMilli() {
				start = strconv.FormatInt(q.Since.UnixMilli(), 10)
			}
		}
	}
	reason := strings.ToLower(q.Reason)
	filtered := q.App != "" || q.Handler != "" || reason != ""
	var p Page
	for {
		n := min(pageBatch, scan-p.Scanned)
		cmd := s.client.B().Xrange().Key(s.key).Start(start).End(end).Count(int64(n)).Build()
		batch, err := s.client.Do(ctx, cmd).AsXRange()
		if err != nil {
			return Page{}, fmt.Errorf("dlq: page %s: %w", s.key, err)
		}
		for i, raw := range batch {
			p.Scanned++
			e, err := Decode(raw.ID, raw.FieldValues)
			switch {
			case err != nil:
				if !filtered {
					p.Undecodable = append(p.Undecodable, err)
				}
			case (q.App == "" || e.App == q.App) && (q.Handler == "" || e.Handler == q.Handler) &&
				(reason == "" || strings.Contains(strings.ToLower(e.Reason), reason)):
				p.Entries = append(p.Entries, e)
			}
			if len(p.Entries) == count {
				if i < len(batch)-1 || len(batch) == n {
					p.Next = raw.ID
				}
				return p, nil
			}
		}
		if len(batch) < n {
			return p, nil // the range is exhausted
		}
		last := batch[len(batch)-1].ID
		if p.Scanned >= scan {
			p.Next = last
			return p, nil
		}
		start = "(" + last
	}
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
