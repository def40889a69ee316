package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

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

// Producer appends events to one stream.
type Producer struct {
	client   rueidis.Client
	stream   string
	maxBytes int
}

// Option configures a Producer.
type Option func(*Producer)

// WithMaxEventBytes sets the largest event the Producer writes; set it to
// the workers' MAX_EVENT_BYTES when that is not the default. n <= 0 means
// no limit. Default: DefaultMaxEventBytes.
func WithMaxEventBytes(n int) Option { return func(p *Producer) { p.maxBytes = n } }

// New returns a Producer for stream on client. The stream is created by
// the first XADD if it does not exist.
func New(client rueidis.Client, stream string, opts ...Option) (*Producer, error) {
	if client == nil {
		return nil, errors.New("producer: nil rueidis client")
	}
	if stream == "" {
		return nil, errors.New("producer: empty stream name")
	}
	p := &Producer{client: client, stream: stream, maxBytes: DefaultMaxEventBytes}
	for _, o := range opts {
		o(p)
	}
	return p, nil
}

// Stream returns the name of the stream p writes to.
func (p *Producer) Stream() string { return p.stream }

// Publish encodes v with encoding/json and publishes it as PublishJSON
// does. v must encode to a JSON object (a struct, a map with string keys,
// a json.RawMessage holding an object, …).
func (p *Producer) Publish(ctx context.Context, v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("%w: encoding %T: %v", ErrInvalidEvent, v, err)
	}
	return p.PublishJSON(ctx, b)
}

// PublishJSON appends one entry with event and the trace context of ctx,
// and returns its stream id ("<ms>-<seq>"). The error wraps ErrInvalidEvent
// (nothing written) when event is not a JSON object that
// matcher.DecodeEvent accepts. Not idempotent: a retry after an error that
// lost the reply may append a second entry.
func (p *Producer) PublishJSON(ctx context.Context, event []byte) (string, error) {
	ids, err := p.PublishBatch(ctx, [][]byte{event})
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// PublishBatch validates every event, then appends them in order in one
// round trip (pipelined XADDs), and returns their ids in the same order.
// When any event is invalid nothing is written and the error names its
// index. A Redis error can leave a prefix of the batch written: the ids of
// the entries written before the first failure are returned with it.
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
	cmds := make(rueidis.Commands, len(events))
	for i, ev := range events {
		cmd := p.client.B().Xadd().Key(p.stream).Id("*").FieldValue().FieldValue(FieldEvent, string(ev))
		for _, f := range trace {
			cmd = cmd.FieldValue(f[0], f[1])
		}
		cmds[i] = cmd.Build()
	}
	ids := make([]string, 0, len(events))
	for _, res := range p.client.DoMulti(ctx, cmds...) {
		id, err := res.ToString()
		if err != nil {
			return ids, fmt.Errorf("producer: XADD to %s: %w", p.stream, err)
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
