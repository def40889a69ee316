package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel/propagation"

	"github.com/relaydev/relay/matcher"
)

// Entry field names of the stream's wire format (docs/delivery.md).
const (
	// FieldEvent holds the event JSON object.
	FieldEvent = "event"
	// FieldTraceparent and FieldTracestate hold the W3C trace context.
	FieldTraceparent = "traceparent"
	FieldTracestate  = "tracestate"
)

// ErrInvalidEvent is wrapped by every error about an event that is not a
// JSON object Relay can decode; nothing was written.
var ErrInvalidEvent = errors.New("producer: invalid event")

// DefaultMaxEventBytes is the largest event a Producer writes unless told
// otherwise: the workers' own default (MAX_EVENT_BYTES), above which they
// dead-letter an event undecoded (docs/delivery.md#oversized-events).
const DefaultMaxEventBytes = 1 << 20

// Stream is where a Producer appends entries: Publish appends one entry
// holding fields (XADD <stream> * field value ...) and returns its id,
// "<ms>-<seq>". Not idempotent: a retry after an error that lost the reply
// may append a second entry. Redis returns the Stream of a Redis stream;
// relaytest.Stream (and relaytest.Consumer), the in-memory stream an
// Engine consumes in tests, and redisstream.Source satisfy it too, so a service
// publishes in its tests with the same Producer code as in production
// (docs/producing.md#go).
type Stream interface {
	Publish(ctx context.Context, fields map[string]string) (string, error)
}

// BatchStream is an optional capability of a Stream: PublishBatch appends
// one entry per element of entries, in order, in one round trip, and
// returns their ids; on an error, the ids of the entries written before
// it. Producer.PublishBatch uses it when the Stream has it, and calls
// Publish once per entry otherwise. The Stream of Redis has it. The other
// optional capability is IdempotentStream, for Producer.PublishOnce.
type BatchStream interface {
	Stream
	PublishBatch(ctx context.Context, entries []map[string]string) ([]string, error)
}

// Producer appends events to one Stream.
type Producer struct {
	stream   Stream
	maxBytes int
	window   time.Duration // of PublishOnce
}

// Option configures a Producer.
type Option func(*Producer)

// WithMaxEventBytes sets the largest event the Producer writes; set it to
// the workers' MAX_EVENT_BYTES when that is not the default. n <= 0 means
// no limit. Default: DefaultMaxEventBytes.
func WithMaxEventBytes(n int) Option { return func(p *Producer) { p.maxBytes = n } }

// New returns a Producer that appends to s: Redis(client, name) for a
// Redis stream, or any other Stream (a relaytest.Stream in tests). The
// error names a nil s, or wraps ErrInvalidIdempotency for a
// WithIdempotencyWindow out of bounds.
func New(s Stream, opts ...Option) (*Producer, error) {
	if r, ok := s.(*RedisStream); s == nil || ok && r == nil {
		return nil, errors.New("producer: New: nil Stream (Redis needs a client and a stream name)")
	}
	p := &Producer{stream: s, maxBytes: DefaultMaxEventBytes, window: DefaultIdempotencyWindow}
	for _, o := range opts {
		o(p)
	}
	if err := validateWindow(p.window); err != nil {
		return nil, fmt.Errorf("producer: New: WithIdempotencyWindow: %w", err)
	}
	return p, nil
}

// RedisStream is the Stream of one Redis stream on a rueidis client,
// which it never closes. The stream is created by the first XADD if it
// does not exist. Safe for concurrent use.
type RedisStream struct {
	client rueidis.Client
	name   string
}

// Redis returns the Stream named name on client; it is nil when client is
// nil or name is empty, which New refuses.
func Redis(client rueidis.Client, name string) *RedisStream {
	if client == nil || name == "" {
		return nil
	}
	return &RedisStream{client: client, name: name}
}

// Name returns the name of the Redis stream.
func (r *RedisStream) Name() string { return r.name }

// Publish appends one entry with fields, in sorted field order (XADD *),
// and returns its id.
func (r *RedisStream) Publish(ctx context.Context, fields map[string]string) (string, error) {
	ids, err := r.PublishBatch(ctx, []map[string]string{fields})
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// PublishBatch appends one entry per element of entries, each in sorted
// field order, with pipelined XADDs in one round trip, and returns their
// ids; on an error, the ids of the entries written before the first
// failure.
func (r *RedisStream) PublishBatch(ctx context.Context, entries []map[string]string) ([]string, error) {
	cmds := make(rueidis.Commands, len(entries))
	for i, fields := range entries {
		if len(fields) == 0 {
			return nil, fmt.Errorf("XADD to %s: entry %d has no fields", r.name, i)
		}
		cmd := r.client.B().Xadd().Key(r.name).Id("*").FieldValue()
		for _, k := range slices.Sorted(maps.Keys(fields)) {
			cmd = cmd.FieldValue(k, fields[k])
		}
		cmds[i] = cmd.Build()
	}
	ids := make([]string, 0, len(entries))
	for _, res := range r.client.DoMulti(ctx, cmds...) {
		id, err := res.ToString()
		if err != nil {
			return ids, fmt.Errorf("XADD to %s: %w", r.name, err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// Publish encodes v with encoding/json and publishes it as PublishJSON
// does. v must encode to a JSON object (a struct, a map with string keys,
// a json.RawMessage holding an object, …).
func (p *Producer) Publish(ctx context.Context, v any) (string, error) {
	b, err := encode(v)
	if err != nil {
		return "", err
	}
	return p.PublishJSON(ctx, b)
}

// encode is json.Marshal with its error wrapping ErrInvalidEvent.
func encode(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: encoding %T: %v", ErrInvalidEvent, v, err)
	}
	return b, nil
}

// PublishJSON appends one entry with event and the trace context of ctx,
// and returns its stream id ("<ms>-<seq>"). The error wraps ErrInvalidEvent
// (nothing written) when event is not a JSON object that
// matcher.DecodeEvent accepts. Not idempotent: a retry after an error that
// lost the reply may append a second entry; PublishOnceJSON is.
func (p *Producer) PublishJSON(ctx context.Context, event []byte) (string, error) {
	ids, err := p.PublishBatch(ctx, [][]byte{event})
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// PublishBatch validates every event, then appends them in order, in one
// round trip when the Stream is a BatchStream (Redis: pipelined XADDs),
// and returns their ids in the same order. When any event is invalid
// nothing is written and the error names its index. A Redis error can
// leave a prefix of the batch written: the ids of the entries written
// before the first failure are returned with it.
func (p *Producer) PublishBatch(ctx context.Context, events [][]byte) ([]string, error) {
	for i, ev := range events {
		if err := ValidateWithin(ev, p.maxBytes); err != nil {
			if len(events) == 1 {
				return nil, err
			}
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
	}
	trace := traceFields(ctx)
	entries := make([]map[string]string, len(events))
	for i, ev := range events {
		entries[i] = entryFields(ev, trace)
	}
	if b, ok := p.stream.(BatchStream); ok {
		ids, err := b.PublishBatch(ctx, entries)
		if err != nil {
			return ids, fmt.Errorf("producer: %w", err)
		}
		return ids, nil
	}
	ids := make([]string, 0, len(events))
	for _, fields := range entries {
		id, err := p.stream.Publish(ctx, fields)
		if err != nil {
			return ids, fmt.Errorf("producer: %w", err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// Validate reports whether event is what a worker with the default
// MAX_EVENT_BYTES runs a handler for: at most DefaultMaxEventBytes, a JSON
// object in valid UTF-8, nested at most matcher.MaxEventDepth deep, with
// nothing after it (docs/delivery.md#from-entry-to-acknowledgement). The
// error wraps ErrInvalidEvent.
func Validate(event []byte) error { return ValidateWithin(event, DefaultMaxEventBytes) }

// ValidateWithin is Validate for workers whose MAX_EVENT_BYTES is
// maxBytes (<= 0: no limit).
func ValidateWithin(event []byte, maxBytes int) error {
	if maxBytes > 0 && len(event) > maxBytes {
		return fmt.Errorf("%w: %d bytes, larger than the workers' limit of %d (MAX_EVENT_BYTES): they would dead-letter it undecoded", ErrInvalidEvent, len(event), maxBytes)
	}
	if _, err := matcher.DecodeEvent(event); err != nil {
		detail := strings.TrimPrefix(err.Error(), matcher.ErrMalformed.Error()+": ")
		return fmt.Errorf("%w: %s", ErrInvalidEvent, detail)
	}
	return nil
}

// entryFields returns the fields of the entry of event: FieldEvent and
// the trace fields.
func entryFields(event []byte, trace [][2]string) map[string]string {
	fields := map[string]string{FieldEvent: string(event)}
	for _, f := range trace {
		fields[f[0]] = f[1]
	}
	return fields
}

// traceFields returns the W3C trace context of ctx's span as entry fields,
// none when the span is not valid.
func traceFields(ctx context.Context) [][2]string {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	var out [][2]string
	for _, f := range []string{FieldTraceparent, FieldTracestate} {
		if v := carrier.Get(f); v != "" {
			out = append(out, [2]string{f, v})
		}
	}
	return out
}
