package relaytest

import (
	"context"
	"fmt"
	"sync"

	"github.com/relaydev/relay/dlq"
)

// DLQ is an in-memory dead-letter queue of one source stream
// (docs/delivery.md#dead-letter-queue): where a StateStore given WithDLQ
// writes the entries of its settlements, with the validation and defaults
// of redisstate.Store, and the reading side of redisdlq.Store with the same
// method signatures: List, Get, Delete, Len. Write appends an entry as
// redisdlq.Writer.Write does, outside any delivery.
//
// Entries are stored as a Redis reader would decode them (dlq.Encode, then
// dlq.Decode): Timestamp in UTC with millisecond precision. Ids are
// "<ms>-<seq>" from the clock, strictly increasing.
//
// Safe for concurrent use.
type DLQ struct {
	stream string
	clock  Clock

	mu      sync.Mutex
	entries []dlq.Entry // in id order
	last    streamID
}

// NewDLQ returns an empty dead-letter queue for sourceStream. Options:
// WithClock. It panics on an empty sourceStream, as redisdlq.NewWriter does.
func NewDLQ(sourceStream string, opts ...Option) *DLQ {
	if sourceStream == "" {
		panic("relaytest: NewDLQ: empty source stream")
	}
	o := buildConfig("NewDLQ", opts, "WithClock")
	return &DLQ{stream: sourceStream, clock: o.clock}
}

// Write validates e as redisdlq.Writer.Write does and appends it, returning the
// new entry id. An empty OriginalStream is taken to be the queue's source
// stream and any other value is an error; a zero Timestamp becomes the
// clock's time; e.ID is ignored. A validation failure is a *dlq.FieldError
// (errors.Is dlq.ErrInvalidEntry) naming the wire field, and writes nothing.
func (d *DLQ) Write(ctx context.Context, e dlq.Entry) (string, error) {
	e, err := d.check(e)
	if err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("relaytest: dlq write %s/%s for %s: %w", e.App, e.Handler, e.OriginalID, err)
	}
	return d.append(e), nil
}

// check fills e's defaults and validates it, as Write does.
func (d *DLQ) check(e dlq.Entry) (dlq.Entry, error) {
	if e.OriginalStream == "" {
		e.OriginalStream = d.stream
	}
	if e.OriginalStream != d.stream {
		return e, &dlq.FieldError{Field: "original_stream", Msg: fmt.Sprintf("%q is not this queue's stream %q", e.OriginalStream, d.stream)}
	}
	if e.Timestamp.IsZero() {
		e.Timestamp = d.clock.Now()
	}
	return e, e.Validate()
}

// append stores e, checked, and returns its new id.
func (d *DLQ) append(e dlq.Entry) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	id := streamID{ms: uint64(max(nowMS(d.clock), 0))}
	if id.compare(d.last) <= 0 {
		id = streamID{ms: d.last.ms, seq: d.last.seq + 1}
	}
	stored, err := dlq.Decode(id.String(), dlq.Encode(e))
	if err != nil {
		// Entry.Validate accepts only entries that decode; this is a bug here.
		panic("relaytest: dlq write: entry does not read back: " + err.Error())
	}
	d.last = id
	d.entries = append(d.entries, stored)
	return stored.ID
}

// List returns the entries that pass f, oldest first, as redisdlq.Store.List
// does: App and Handler match exactly, Since compares with the millisecond
// part of the entry id, Limit 0 means no limit.
func (d *DLQ) List(ctx context.Context, f dlq.Filter) ([]dlq.Entry, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("relaytest: dlq list: Limit must be >= 0, got %d", f.Limit)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("relaytest: dlq list: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []dlq.Entry
	for _, e := range d.entries {
		id, _ := parseID(e.ID)
		if !f.Since.IsZero() && int64(id.ms) < f.Since.UnixMilli() {
			continue
		}
		if (f.App != "" && e.App != f.App) || (f.Handler != "" && e.Handler != f.Handler) {
			continue
		}
		out = append(out, e)
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out, nil
}

// Get returns the entry with id; an unknown or ill-formed id wraps
// dlq.ErrNotFound.
func (d *DLQ) Get(ctx context.Context, id string) (dlq.Entry, error) {
	if err := ctx.Err(); err != nil {
		return dlq.Entry{}, fmt.Errorf("relaytest: dlq get %s: %w", id, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	i, err := d.index(id)
	if err != nil {
		return dlq.Entry{}, err
	}
	return d.entries[i], nil
}

// Delete removes the entry with id; an unknown or ill-formed id, or one
// already deleted, wraps dlq.ErrNotFound.
func (d *DLQ) Delete(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("relaytest: dlq delete %s: %w", id, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	i, err := d.index(id)
	if err != nil {
		return err
	}
	d.entries = append(d.entries[:i], d.entries[i+1:]...)
	return nil
}

// Len returns the number of entries.
func (d *DLQ) Len(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("relaytest: dlq len: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return int64(len(d.entries)), nil
}

// index finds id among the entries. d.mu must be held.
func (d *DLQ) index(id string) (int, error) {
	if _, err := parseID(id); err != nil {
		return 0, fmt.Errorf("%w: %q is not a stream id", dlq.ErrNotFound, id)
	}
	for i, e := range d.entries {
		if e.ID == id {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%w: %s", dlq.ErrNotFound, id)
}
