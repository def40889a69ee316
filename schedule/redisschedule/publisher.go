package redisschedule

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/schedule"
)

// SpanPublish is the name of the span around one publish attempt
// (docs/observability.md#spans).
const SpanPublish = telemetry.SpanSchedulePublish

// instrumentationName identifies this package's tracer.
const instrumentationName = "github.com/relaydev/relay/schedule"

// Span and log attribute keys for occurrences.
const (
	attrApp         = "app"
	attrSchedule    = "schedule"
	attrScheduledAt = "scheduled_at"
	attrPublished   = "published"
)

// Publisher writes schedule occurrences into one stream, each at most once
// across all workers (docs/schedules.md#one-occurrence-however-many-workers):
// one Lua script checks the occurrence's dedup key, XADDs the envelope and
// sets the key with a DedupTTL lifetime. It never closes the client.
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	client rueidis.Client
	stream string
	tracer trace.Tracer
}

// NewPublisher returns a Publisher of occurrences into stream, the stream
// the engine consumes. The only option it takes is WithTracerProvider.
// It fails when client is nil, stream is empty, client is a Redis Cluster
// client and stream has no hash tag (docs/deployment.md), or an option is
// invalid.
func NewPublisher(client rueidis.Client, stream string, opts ...Option) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("schedule: NewPublisher: nil client")
	}
	if stream == "" {
		return nil, errors.New("schedule: NewPublisher: empty stream name")
	}
	if _, tagged := keys.HashTag(stream); !tagged && client.Mode() == rueidis.ClientModeCluster {
		// The publish script touches the stream and the dedup key; only a
		// shared hash tag puts both in one slot.
		return nil, fmt.Errorf("schedule: NewPublisher: stream %q has no hash tag, so under Redis Cluster its dedup keys land in other slots; name the stream with a tag such as {%s}", stream, stream)
	}
	o := defaultOptions(forPublisher)
	if err := o.apply(opts); err != nil {
		return nil, fmt.Errorf("schedule: NewPublisher: %w", err)
	}
	return &Publisher{client: client, stream: stream, tracer: newTracer(o.tracerProvider)}, nil
}

func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(instrumentationName)
}

// Stream returns the stream occurrences are published to.
func (p *Publisher) Stream() string { return p.stream }

// Publish writes the occurrence of spec at the instant at, unless that
// occurrence was published before (its dedup key still exists). It reports
// whether this call wrote it; (false, nil) is a duplicate, an expected
// outcome when several workers publish the same occurrence.
//
// at must be a whole second; the caller is responsible for it being a
// firing of spec (Spec.Next, Spec.Latest), since the consumer rejects
// anything else. spec.App, Name and Handler must not be empty; Cron is not
// used.
//
// The entry has the field "event" (the Envelope JSON) and, when the span
// around the call is valid, "traceparent" and "tracestate" (if any). Publish
// makes one attempt; retrying and the outbox are the Scheduler's job. On an
// error nothing was written, unless the reply was lost after the script ran,
// in which case a retry reports a duplicate.
func (p *Publisher) Publish(ctx context.Context, spec schedule.Spec, at time.Time) (bool, error) {
	return p.publish(ctx, p.tracer, spec, at)
}

func (p *Publisher) publish(ctx context.Context, tracer trace.Tracer, spec schedule.Spec, at time.Time) (published bool, err error) {
	switch {
	case spec.App == "" || spec.Name == "" || spec.Handler == "":
		return false, fmt.Errorf("schedule: publish %s/%s: app, name and handler must not be empty", spec.App, spec.Name)
	case !at.Truncate(time.Second).Equal(at):
		return false, fmt.Errorf("schedule: publish %s/%s: instant %s is not a whole second", spec.App, spec.Name, at.UTC().Format(time.RFC3339Nano))
	}
	env := schedule.NewEnvelope(spec, at)
	ctx, span := tracer.Start(ctx, SpanPublish,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String(attrApp, spec.App),
			attribute.String(attrSchedule, spec.Name),
			attribute.String(attrScheduledAt, env.ScheduledAt),
		))
	defer func() {
		span.SetAttributes(attribute.Bool(attrPublished, published))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "publish failed")
		}
		span.End()
	}()

	args := []string{strconv.FormatInt(DedupTTL.Milliseconds(), 10), string(env.Marshal())}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	for _, f := range []string{"traceparent", "tracestate"} {
		if v := carrier.Get(f); v != "" {
			args = append(args, f, v)
		}
	}
	dedup := keys.ScheduleOccurrence(p.stream, spec.App, spec.Name, at)
	reply, err := publishScript.Exec(ctx, p.client, []string{dedup, p.stream}, args).ToArray()
	if err != nil {
		return false, fmt.Errorf("schedule: publish %s to %s: %w", env.OccurrenceID, p.stream, err)
	}
	code, id, err := publishReply(reply)
	if err != nil {
		return false, fmt.Errorf("schedule: publish %s to %s: %w", env.OccurrenceID, p.stream, err)
	}
	span.SetAttributes(attribute.String("stream.entry_id", id))
	return code == codePublished, nil
}

// publishReply decodes publish.lua's {code, id}.
func publishReply(reply []rueidis.RedisMessage) (int64, string, error) {
	if len(reply) != 2 {
		return 0, "", fmt.Errorf("unexpected script reply of %d elements", len(reply))
	}
	code, err := reply[0].AsInt64()
	if err != nil {
		return 0, "", fmt.Errorf("script reply code: %w", err)
	}
	id, err := reply[1].ToString()
	if err != nil {
		return 0, "", fmt.Errorf("script reply entry id: %w", err)
	}
	if code != codePublished && code != codeDuplicate {
		return 0, "", fmt.Errorf("unknown script reply code %d", code)
	}
	return code, id, nil
}

// ServerTime returns the Redis server's clock (TIME), the clock the
// Scheduler decides due occurrences by unless WithNow replaces it.
func (p *Publisher) ServerTime(ctx context.Context) (time.Time, error) {
	parts, err := p.client.Do(ctx, p.client.B().Time().Build()).AsStrSlice()
	if err != nil {
		return time.Time{}, fmt.Errorf("schedule: read Redis TIME: %w", err)
	}
	if len(parts) != 2 {
		return time.Time{}, fmt.Errorf("schedule: read Redis TIME: got %d values, want 2", len(parts))
	}
	sec, err1 := strconv.ParseInt(parts[0], 10, 64)
	usec, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, fmt.Errorf("schedule: read Redis TIME: malformed reply %q", parts)
	}
	return time.Unix(sec, usec*int64(time.Microsecond)).UTC(), nil
}
