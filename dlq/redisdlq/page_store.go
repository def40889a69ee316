package redisdlq

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/stream"
)

// pageBatch is how many entries one XRANGE of Page reads.
const pageBatch = 200

// filtered reports whether q selects by anything but the time range.
func filtered(q dlq.PageQuery) bool {
	return q.App != "" || q.Handler != "" || q.HandlerPrefix != "" || q.Reason != "" || q.Text != ""
}

// matcher returns the test of q's filters other than the time range.
func matcher(q dlq.PageQuery) func(dlq.Entry) bool {
	prefix, reason, text := strings.ToLower(q.HandlerPrefix), strings.ToLower(q.Reason), strings.ToLower(q.Text)
	return func(e dlq.Entry) bool {
		return (q.App == "" || e.App == q.App) && (q.Handler == "" || e.Handler == q.Handler) &&
			(prefix == "" || strings.HasPrefix(strings.ToLower(e.Handler), prefix)) &&
			(reason == "" || strings.Contains(strings.ToLower(e.Reason), reason)) &&
			(text == "" || strings.Contains(strings.ToLower(e.Event), text))
	}
}

// Page returns up to q.Count entries that pass q, oldest first (newest
// first with q.Newest), starting after q.After. It reads the stream with
// XRANGE (XREVRANGE) ... COUNT in batches and never more than q.Scan
// entries, so its cost is bounded whatever the length of the stream; it
// never loads the whole stream.
func (s *Store) Page(ctx context.Context, q dlq.PageQuery) (dlq.Page, error) {
	count, scan := q.Count, q.Scan
	if count < 0 || scan < 0 {
		return dlq.Page{}, fmt.Errorf("dlq: page: Count and Scan must be >= 0, got %d and %d", count, scan)
	}
	if count == 0 {
		count = dlq.DefaultPageCount
	}
	if scan == 0 {
		scan = dlq.DefaultPageScan
	}
	var p dlq.Page
	match := matcher(q)
	var err error
	p.Scanned, p.Next, err = s.scan(ctx, q, max(scan, count), func(e dlq.Entry, derr error) bool {
		switch {
		case derr != nil:
			if !filtered(q) {
				p.Undecodable = append(p.Undecodable, derr)
			}
		case match(e):
			p.Entries = append(p.Entries, e)
		}
		return len(p.Entries) < count
	})
	if err != nil {
		return dlq.Page{}, fmt.Errorf("dlq: page %s: %w", s.key, err)
	}
	return p, nil
}

// Count returns how many entries pass q (its After, Count and Scan
// aside), reading at most budget entries: complete is false when the
// budget ended the count first, n then counting the entries read so far.
func (s *Store) Count(ctx context.Context, q dlq.PageQuery, budget int) (n int, complete bool, err error) {
	q.After = ""
	match := matcher(q)
	_, next, err := s.scan(ctx, q, budget, func(e dlq.Entry, derr error) bool {
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
func (s *Store) scan(ctx context.Context, q dlq.PageQuery, budget int, each func(dlq.Entry, error) bool) (scanned int, next string, err error) {
	lo, hi, empty, err := bounds(q)
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
			if !each(dlq.Decode(raw.ID, raw.FieldValues)) {
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
func bounds(q dlq.PageQuery) (lo, hi string, empty bool, err error) {
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
