package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
)

// Writer appends entries to the dead-letter stream of one source stream. It
// implements relay.DLQWriter and is safe for concurrent use.
type Writer struct {
	client rueidis.Client
	stream string // the source stream
	key    string // keys.DLQ(stream)
	// writtenTTL is how long the written marker of an invocation is kept.
	writtenTTL time.Duration
	// fence: write only while the entry's message is pending (WithPELFence).
	fence bool
}

// WriterOption configures a Writer.
type WriterOption func(*Writer)

// WithWrittenTTL sets how long the Writer remembers that an invocation's
// entry was written (default WrittenTTL). It should be the retention of
// the invocation state (relay.Config.Retention), which worker.Worker
// passes: a redelivery that could write the entry again is only possible
// while that state exists, and a shorter retention then bounds the markers
// too. A d <= 0 keeps the default.
func WithWrittenTTL(d time.Duration) WriterOption {
	return func(w *Writer) {
		if d > 0 {
			w.writtenTTL = d
		}
	}
}

// WithPELFence makes Write append an entry only while its message is
// pending: OriginalID in the PEL of Group on the source stream, checked in
// the script that appends it. A delivery stalled between finding an
// invocation exhausted and writing its entry, whose message then left the
// PEL (its reference cleared for a missing payload, or acknowledged), then
// writes nothing and gets ErrNotPending, as every transition of such a
// delivery is refused (docs/delivery.md#invocation-state). worker.Worker
// sets it; Redis Cluster needs the stream's hash tag, as for the
// invocation state.
func WithPELFence() WriterOption {
	return func(w *Writer) { w.fence = true }
}

// ErrNotPending is returned by a Writer WithPELFence for an entry whose
// message is not pending in its group.
var ErrNotPending = errors.New("dlq: the message is no longer pending")

// NewWriter returns a Writer for the dead-letter stream of sourceStream. It
// never closes client. It panics when client is nil or sourceStream is
// empty, which are programming errors.
func NewWriter(client rueidis.Client, sourceStream string, opts ...WriterOption) *Writer {
	if client == nil {
		panic("dlq: NewWriter: nil client")
	}
	if sourceStream == "" {
		panic("dlq: NewWriter: empty source stream")
	}
	w := &Writer{client: client, stream: sourceStream, key: keys.DLQ(sourceStream), writtenTTL: WrittenTTL}
	for _, o := range opts {
		o(w)
	}
	return w
}

// Key returns the Redis key of the dead-letter stream.
func (w *Writer) Key() string { return w.key }

// Write validates e and appends it (XADD <dlq> *), returning the new entry
// id. An empty OriginalStream is taken to be the Writer's source stream and
// any other value is an error; a zero Timestamp becomes the current time;
// e.ID is ignored. OriginalID, Group, Consumer, Reason, App and Handler must
// be non-empty; a malformed-message entry has App and Handler MalformedName
// and HandlerAttempts 0, any other has HandlerAttempts >= 1. A validation
// failure is a *FieldError (errors.Is ErrInvalidEntry) and writes nothing.
//
// Write is idempotent per invocation: the first write for a Group,
// OriginalID, App and Handler appends the entry and records its id in
// keys.DLQWritten (kept for WrittenTTL, or WithWrittenTTL), in one script; a later write of the
// same invocation appends nothing and returns that first id, even when the
// entry was deleted since. So two deliveries that both find an invocation
// exhausted, or a retry after a crash between the write and the
// invocation's ":dlq" marker, leave one entry
// (docs/delivery.md#dead-letter-queue).
func (w *Writer) Write(ctx context.Context, e Entry) (string, error) {
	if e.OriginalStream == "" {
		e.OriginalStream = w.stream
	}
	if e.OriginalStream != w.stream {
		return "", &FieldError{Field: fieldOriginalStream, Msg: fmt.Sprintf("%q is not this queue's stream %q", e.OriginalStream, w.stream)}
	}
	if e.Timestamp.IsZero() {
		e.Timestamp = time.Now()
	}
	if err := e.Validate(); err != nil {
		return "", err
	}
	args := append([]string{strconv.FormatInt(w.writtenTTL.Milliseconds(), 10), e.Group, e.OriginalID}, EncodePairs(e)...)
	ks := []string{w.key, keys.DLQWritten(w.stream, e.Group, e.OriginalID, e.App, e.Handler)}
	if w.fence {
		ks = append(ks, w.stream)
	}
	id, err := writeScript.Exec(ctx, w.client, ks, args).ToString()
	if rueidis.IsRedisNil(err) {
		err = ErrNotPending
	}
	if err != nil {
		return "", fmt.Errorf("dlq: write %s/%s for %s: %w", e.App, e.Handler, e.OriginalID, err)
	}
	return id, nil
}

// WrittenTTL is how long Writer remembers by default that an invocation's
// entry was written: longer than the invocation state is retained by
// default (relay.DefaultRetention, 48h), after which no delivery of the
// message can still be running. WithWrittenTTL follows another retention.
const WrittenTTL = 7 * 24 * time.Hour

// writeScript appends an entry unless the invocation's written marker
// exists, and sets the marker to the new id (Writer.Write). With KEYS[3]
// (WithPELFence) it appends nothing, and returns nil, when the message is
// not in the group's PEL (a missing group or stream has none).
//
// KEYS[1] the DLQ stream, KEYS[2] keys.DLQWritten, KEYS[3] the source
// stream (optional)
// ARGV[1] marker TTL in ms, ARGV[2] group, ARGV[3] message id, ARGV[4..]
// the entry's field/value pairs
// Returns the id of the invocation's entry, or nil.
var writeScript = rueidis.NewLuaScriptRetryable(`
local id = redis.call('GET', KEYS[2])
if id then
  return id
end
if KEYS[3] then
  local p = redis.pcall('XPENDING', KEYS[3], ARGV[2], ARGV[3], ARGV[3], 1)
  if type(p) == 'table' and p.err then
    if string.sub(p.err, 1, 8) ~= 'NOGROUP ' then
      return p
    end
    return false
  end
  if #p == 0 then
    return false
  end
end
id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return id
`)
