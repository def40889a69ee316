package dlq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

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

// filtered reports whether q selects by anything but the time range.
func (q PageQuery) filtered() bool {
	return q.App != "" || q.Handler != "" || q.HandlerPrefix != "" || q.Reason != "" || q.Text != ""
}

// Filtered reports whether q selects by anything at all: a filtered count
// must be counted (Count), an unfiltered one is the stream's length.
func (q PageQuery) Filtered() bool {
	return q.filtered() || !q.Since.IsZero() || !q.Before.IsZero()
}

// matcher returns the test of q's filters other than the time range.
func (q PageQuery) matcher() func(Entry) bool {
	prefix, reason, text := strings.ToLower(q.HandlerPrefix), strings.ToLower(q.Reason), strings.ToLower(q.Text)
	return func(e Entry) bool {
		return (q.App == "" || e.App == q.App) && (q.Handler == "" || e.Handler == q.Handler) &&
			(prefix == "" || strings.HasPrefix(strings.ToLower(e.Handler), prefix)) &&
			(reason == "" || strings.Contains(strings.ToLower(e.Reason), reason)) &&
			(text == "" || strings.Contains(strings.ToLower(e.Event), text))
	}
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

// Page returns up to q.Count entries that pass q, oldest first (newest
// first with q.Newest), starting after q.After. It reads the stream with
// XRANGE (XREVRANGE) ... COUNT in batches and never more than q.Scan
// entries, so its cost is bounded whatever the length of the stream; it
// never loads the whole stream.
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
	var p Page
	match := q.matcher()
	var err error
	p.Scanned, p.Next, err = s.scan(ctx, q, max(scan, count), func(e Entry, derr error) bool {
		switch {
		case derr != nil:
			if !q.filtered() {
				p.Undecodable = append(p.Undecodable, derr)
			}
		case match(e):
			p.Entries = append(p.Entries, e)
		}
		return len(p.Entries) < count
	})
	if err != nil {
		return Page{}, fmt.Errorf("dlq: page %s: %w", s.key, err)
	}
	return p, nil
}

// Count returns how many entries pass q (its After, Count and Scan
// aside), reading at most budget entries: complete is false when the
// budget ended the count first, n then counting the entries read so far.
func (s *Store) Count(ctx context.Context, q PageQuery, budget int) (n int, complete bool, err error) {
	q.After = ""
	match := q.matcher()
	_, next, err := s.scan(ctx, q, budget, func(e Entry, derr error) bool {
		if derr == nil && match(e) {
			n++
		}
		return true
	})
	if err != nil {
		return 0, false, fmt.Errorf("dlq: count %s: %w", s.key, err)
	}
	return n, next == "", nil
}

// scan reads q's id range in q's order from its cursor, calling each for
// every entry (decoded, or the decoding error) until each returns false or
// budget entries were read. next is the id to continue after, "" when the
// range is exhausted.
func (s *Store) scan(ctx context.Context, q PageQuery, budget int, each func(Entry, error) bool) (scanned int, next string, err error) {
	lo, hi, empty, err := q.bounds()
	if err != nil || empty {
		return 0, "", err
	}
	for {
		n := min(pageBatch, budget-scanned)
		var cmd rueidis.Completed
		if q.Newest {
			cmd = s.client.B().Xrevrange().Key(s.key).End(hi).Start(lo).Count(int64(n)).Build()
		} else {
			cmd = s.client.B().Xrange().Key(s.key).Start(lo).End(hi).Count(int64(n)).Build()
		}
		batch, err := s.client.Do(ctx, cmd).AsXRange()
		if err != nil {
			return scanned, "", err
		}
		for i, raw := range batch {
			scanned++
			if !each(Decode(raw.ID, raw.FieldValues)) {
				if i < len(batch)-1 || len(batch) == n {
					next = raw.ID
				}
				return scanned, next, nil
			}
		}
		if len(batch) < n {
			return scanned, "", nil // the range is exhausted
		}
		last := batch[len(batch)-1].ID
		if scanned >= budget {
			return scanned, last, nil
		}
		if q.Newest {
			hi = "(" + last
		} else {
			lo = "(" + last
		}
	}
}

// bounds returns the id range of q, from its time range and its cursor,
// as XRANGE's start and end; empty when no id can be in it.
func (q PageQuery) bounds() (lo, hi string, empty bool, err error) {
	lo, hi = "-", "+"
	if !q.Since.IsZero() {
		lo = strconv.FormatInt(max(q.Since.UnixMilli(), 0), 10)
	}
	if !q.Before.IsZero() {
		ms := q.Before.UnixMilli() - 1
		if ms < 0 || !q.Since.IsZero() && q.Since.UnixMilli() > ms {
			return "", "", true, nil
		}
		hi = strconv.FormatInt(ms, 10)
	}
	if q.After == "" {
		return lo, hi, false, nil
	}
	ms, seq, err := stream.ParseID(q.After)
	if err != nil {
		return "", "", false, fmt.Errorf("dlq: page: cursor %q is not a stream id", q.After)
	}
	// A cursor outside the time range (the filter changed between pages)
	// must not widen it.
	if q.Newest {
		if ms == 0 && seq == 0 {
			return "", "", true, nil // no id precedes it; Redis refuses "(" after it
		}
		if q.Before.IsZero() || int64(ms) < q.Before.UnixMilli() {
			hi = "(" + q.After
		}
		return lo, hi, false, nil
	}
	if ms == math.MaxUint64 && seq == math.MaxUint64 {
		return "", "", true, nil // no id follows it; Redis refuses "(" before it
	}
	if q.Since.IsZero() || int64(ms) >= q.Since.UnixMilli() {
		lo = "(" + q.After
	}
	return lo, hi, false, nil
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
