package redisdlq

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
)

// Writer appends entries to the dead-letter stream of one source stream,
// outside any delivery (tools, tests, migrations), and trims it (Trim).
// The Engine writes its dead letters through the StateStore's Settle, in
// the same step as their invocations' ":dlq" markers
// (docs/delivery.md#dead-letter-queue). Safe for concurrent use.
type Writer struct {
	client rueidis.Client
	stream string // the source stream
	key    string // keys.DLQ(stream)
}

// NewWriter returns a Writer for the dead-letter stream of sourceStream. It
// never closes client. It panics when client is nil or sourceStream is
// empty, which are programming errors.
func NewWriter(client rueidis.Client, sourceStream string) *Writer {
	if client == nil {
		panic("dlq: NewWriter: nil client")
	}
	if sourceStream == "" {
		panic("dlq: NewWriter: empty source stream")
	}
	return &Writer{client: client, stream: sourceStream, key: keys.DLQ(sourceStream)}
}

// Key returns the Redis key of the dead-letter stream.
func (w *Writer) Key() string { return w.key }

// Write validates e and appends it (XADD <dlq> *), returning the new entry
// id. An empty OriginalStream is taken to be the Writer's source stream and
// any other value is an error; a zero Timestamp becomes the current time;
// e.ID is ignored. OriginalID, Group, Consumer, Reason, App and Handler must
// be non-empty; a malformed-message entry has App and Handler dlq.MalformedName
// and HandlerAttempts 0, any other has HandlerAttempts >= 0 (0 when no
// attempt ran, as for a message past its rule's max_age). A validation
// failure is a *dlq.FieldError (errors.Is dlq.ErrInvalidEntry) and writes nothing.
// Every call appends: a retry after a lost reply may append twice.
func (w *Writer) Write(ctx context.Context, e dlq.Entry) (string, error) {
	if e.OriginalStream == "" {
		e.OriginalStream = w.stream
	}
	if e.OriginalStream != w.stream {
		return "", &dlq.FieldError{Field: "original_stream", Msg: fmt.Sprintf("%q is not this queue's stream %q", e.OriginalStream, w.stream)}
	}
	if e.Timestamp.IsZero() {
		e.Timestamp = time.Now()
	}
	if err := e.Validate(); err != nil {
		return "", err
	}
	add := w.client.B().Xadd().Key(w.key).Id("*").FieldValue()
	pairs := dlq.EncodePairs(e)
	for i := 0; i < len(pairs); i += 2 {
		add = add.FieldValue(pairs[i], pairs[i+1])
	}
	id, err := w.client.Do(ctx, add.Build()).ToString()
	if err != nil {
		return "", fmt.Errorf("dlq: write %s/%s for %s: %w", e.App, e.Handler, e.OriginalID, err)
	}
	return id, nil
}
