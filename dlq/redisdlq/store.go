package redisdlq

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/stream"
)

// listPage is how many entries List reads per XRANGE.
const listPage = 100

// Store reads and administers the dead-letter stream of one source stream
// (relay dlq ls / inspect / rm). It embeds a Writer, so it appends and
// trims too (a relaytest.DLQWriter). Safe for concurrent use.
type Store struct {
	Writer
}

// NewStore returns a Store for the dead-letter stream of sourceStream. It
// never closes client and panics like NewWriter.
func NewStore(client rueidis.Client, sourceStream string) *Store {
	return &Store{Writer: *NewWriter(client, sourceStream)}
}

// List returns the entries that pass f, oldest first. It fails on the first
// entry dlq.Decode rejects, naming its id, so that one can be inspected or
// removed.
func (s *Store) List(ctx context.Context, f dlq.Filter) ([]dlq.Entry, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("dlq: list: Limit must be >= 0, got %d", f.Limit)
	}
	start := "-"
	if !f.Since.IsZero() {
		start = strconv.FormatInt(max(f.Since.UnixMilli(), 0), 10)
	}
	var out []dlq.Entry
	for {
		cmd := s.client.B().Xrange().Key(s.key).Start(start).End("+").Count(listPage).Build()
		page, err := s.client.Do(ctx, cmd).AsXRange()
		if err != nil {
			return nil, fmt.Errorf("dlq: list %s: %w", s.key, err)
		}
		for _, raw := range page {
			e, err := dlq.Decode(raw.ID, raw.FieldValues)
			if err != nil {
				return nil, err
			}
			if (f.App != "" && e.App != f.App) || (f.Handler != "" && e.Handler != f.Handler) {
				continue
			}
			out = append(out, e)
			if f.Limit > 0 && len(out) == f.Limit {
				return out, nil
			}
		}
		if len(page) < listPage {
			return out, nil
		}
		start = "(" + page[len(page)-1].ID
	}
}

// Get returns the entry with id. An unknown or ill-formed id wraps
// dlq.ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (dlq.Entry, error) {
	if !stream.IsID(id) {
		return dlq.Entry{}, fmt.Errorf("%w: %q is not a stream id", dlq.ErrNotFound, id)
	}
	cmd := s.client.B().Xrange().Key(s.key).Start(id).End(id).Count(1).Build()
	page, err := s.client.Do(ctx, cmd).AsXRange()
	if err != nil {
		return dlq.Entry{}, fmt.Errorf("dlq: get %s: %w", id, err)
	}
	if len(page) == 0 {
		return dlq.Entry{}, fmt.Errorf("%w: %s", dlq.ErrNotFound, id)
	}
	return dlq.Decode(page[0].ID, page[0].FieldValues)
}

// Delete removes the entry with id (XDEL) and its replay history. An
// unknown or ill-formed id, or one already deleted, wraps dlq.ErrNotFound.
func (s *Store) Delete(ctx context.Context, id string) error {
	if !stream.IsID(id) {
		return fmt.Errorf("%w: %q is not a stream id", dlq.ErrNotFound, id)
	}
	b := s.client.B()
	res := s.client.DoMulti(ctx, b.Xdel().Key(s.key).Id(id).Build(), b.Del().Key(keys.DLQReplays(s.stream, id)).Build())
	n, err := res[0].AsInt64()
	if err == nil {
		err = res[1].Error()
	}
	if err != nil {
		return fmt.Errorf("dlq: delete %s: %w", id, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %s", dlq.ErrNotFound, id)
	}
	return nil
}

// Len returns the number of entries in the dead-letter stream (XLEN).
func (s *Store) Len(ctx context.Context) (int64, error) {
	n, err := s.client.Do(ctx, s.client.B().Xlen().Key(s.key).Build()).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("dlq: len %s: %w", s.key, err)
	}
	return n, nil
}
