package producer

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
)

// Bounds of idempotent publish (docs/producing.md#idempotent-publish).
const (
	// DefaultIdempotencyWindow is how long a key is remembered unless
	// WithIdempotencyWindow says otherwise.
	DefaultIdempotencyWindow = 24 * time.Hour
	// MinIdempotencyWindow and MaxIdempotencyWindow bound the window: a
	// shorter one would not outlast a client's retries, a longer one would
	// pin a dedup key in Redis's memory for every event of a month.
	MinIdempotencyWindow = time.Second
	MaxIdempotencyWindow = 30 * 24 * time.Hour
	// MaxIdempotencyKeyBytes is the longest idempotency key, in bytes: room
	// for a UUID, an order number or a few of them joined, not for a
	// payload. Every key is kept in Redis for the whole window.
	MaxIdempotencyKeyBytes = 256
)

// ErrInvalidIdempotency is wrapped by every error about an idempotency key
// or window outside the bounds above; nothing was written.
var ErrInvalidIdempotency = errors.New("producer: invalid idempotent publish")

// ErrNotIdempotent is wrapped by the error of Producer.PublishOnce on a
// Stream that is not an IdempotentStream; nothing was written.
var ErrNotIdempotent = errors.New("producer: the Stream cannot publish idempotently")

// IdempotentStream is an optional capability of a Stream: PublishOnce
// appends one entry holding fields unless an earlier PublishOnce of the
// same key on this stream did so less than window ago, and returns the id
// of the entry the key records: the new one (first true) or the earlier
// one (first false, nothing written). Concurrent calls with one key
// append one entry between them and all return its id. The window runs
// from the publish that added the entry; duplicates do not extend it.
// key and window must pass ValidateIdempotency. The Stream of Redis has it
// (one Lua script per call), and so has relaytest.Stream (on its Clock).
type IdempotentStream interface {
	Stream
	PublishOnce(ctx context.Context, key string, window time.Duration, fields map[string]string) (id string, first bool, err error)
}

// WithIdempotencyWindow sets how long PublishOnce remembers a key, from
// the publish that added its entry: MinIdempotencyWindow (1s) to
// MaxIdempotencyWindow (30 days), in whole milliseconds; New refuses
// others with an error wrapping ErrInvalidIdempotency. Default:
// DefaultIdempotencyWindow (24h).
func WithIdempotencyWindow(d time.Duration) Option { return func(p *Producer) { p.window = d } }

// ValidateIdempotency reports whether key and window are what PublishOnce
// accepts: key 1 to MaxIdempotencyKeyBytes bytes (any bytes, compared
// exactly), window MinIdempotencyWindow to MaxIdempotencyWindow. The error
// wraps ErrInvalidIdempotency and says which bound was crossed.
func ValidateIdempotency(key string, window time.Duration) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: the idempotency key is empty", ErrInvalidIdempotency)
	case len(key) > MaxIdempotencyKeyBytes:
		return fmt.Errorf("%w: the idempotency key is %d bytes, longer than the limit of %d", ErrInvalidIdempotency, len(key), MaxIdempotencyKeyBytes)
	}
	return validateWindow(window)
}

func validateWindow(window time.Duration) error {
	switch {
	case window < MinIdempotencyWindow:
		return fmt.Errorf("%w: the idempotency window %s is shorter than %s", ErrInvalidIdempotency, window, MinIdempotencyWindow)
	case window > MaxIdempotencyWindow:
		return fmt.Errorf("%w: the idempotency window %s is longer than 30 days (720h)", ErrInvalidIdempotency, window)
	}
	return nil
}

// PublishOnce encodes v with encoding/json and publishes it as
// PublishOnceJSON does.
func (p *Producer) PublishOnce(ctx context.Context, key string, v any) (id string, first bool, err error) {
	b, err := encode(v)
	if err != nil {
		return "", false, err
	}
	return p.PublishOnceJSON(ctx, key, b)
}

// PublishOnceJSON appends one entry with event and the trace context of
// ctx, as PublishJSON does, unless a PublishOnce with the same key on the
// same stream added one within the Producer's window
// (WithIdempotencyWindow, 24h by default): then it writes nothing and
// returns that entry's id. first reports whether this call added the
// entry. Concurrent publishers of one key, in this process or others, add
// one entry between them and all get its id. Only the key is compared: a
// duplicate's event and trace context are dropped, not checked against
// the first's. A retry after an error is safe: if the failed call did
// write, the retry returns its id with first false.
//
// The error wraps ErrInvalidIdempotency for a bad key, ErrInvalidEvent for
// a bad event, ErrNotIdempotent when the Stream is not an IdempotentStream;
// nothing is written then. docs/producing.md#idempotent-publish.
func (p *Producer) PublishOnceJSON(ctx context.Context, key string, event []byte) (id string, first bool, err error) {
	if err := ValidateIdempotency(key, p.window); err != nil {
		return "", false, err
	}
	if err := ValidateWithin(event, p.maxBytes); err != nil {
		return "", false, err
	}
	s, ok := p.stream.(IdempotentStream)
	if !ok {
		return "", false, fmt.Errorf("%w: %T has no PublishOnce (producer.IdempotentStream); producer.Redis and relaytest.Stream do", ErrNotIdempotent, p.stream)
	}
	id, first, err = s.PublishOnce(ctx, key, p.window, entryFields(event, traceFields(ctx)))
	if err != nil {
		return "", false, fmt.Errorf("producer: %w", err)
	}
	return id, first, nil
}

// publishOnceScript is run by RedisStream.PublishOnce. Not retryable by
// rueidis: a rerun after a lost reply would report a duplicate of the
// entry the first run added, so first would lie; the caller's own retry
// gets the id either way.
//
//go:embed scripts/publish_once.lua
var publishOnceSource string

var publishOnceScript = rueidis.NewLuaScript(publishOnceSource)

// PublishOnce appends one entry with fields, in sorted field order,
// unless the dedup key of key (relay:idempotency:<stream>:<key>,
// docs/delivery.md#data-layout-in-redis) records an entry of the last
// window; see IdempotentStream. The window is set in whole milliseconds. Check, XADD
// and SET of the dedup key run in one Lua script, so concurrent
// publishers are serialised and a failed XADD leaves no key; Redis
// persists and replicates a script's writes together, so a crash keeps
// both or neither. On Redis Cluster the stream needs a hash tag
// ("{orders}") for the dedup key to share its slot; without one the error
// says so and nothing is written.
func (r *RedisStream) PublishOnce(ctx context.Context, key string, window time.Duration, fields map[string]string) (id string, first bool, err error) {
	if err := ValidateIdempotency(key, window); err != nil {
		return "", false, err
	}
	if len(fields) == 0 {
		return "", false, fmt.Errorf("idempotent XADD to %s: the entry has no fields", r.name)
	}
	dedup := keys.Idempotency(r.name, key)
	// rueidis panics on a cross-slot command of a cluster client: refuse
	// before building it.
	if r.client.Mode() == rueidis.ClientModeCluster && keys.Slot(dedup) != keys.Slot(r.name) {
		return "", false, fmt.Errorf("idempotent XADD to %s: on Redis Cluster the stream needs a hash tag, such as {%s}, for its dedup key to share its hash slot (docs/deployment.md#redis-cluster-one-hash-slot-per-stream)", r.name, r.name)
	}
	args := make([]string, 0, 1+2*len(fields))
	args = append(args, strconv.FormatInt(window.Milliseconds(), 10))
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		args = append(args, k, fields[k])
	}
	reply, err := publishOnceScript.Exec(ctx, r.client, []string{dedup, r.name}, args).ToArray()
	if err != nil {
		return "", false, fmt.Errorf("idempotent XADD to %s: %w", r.name, err)
	}
	if len(reply) != 2 {
		return "", false, fmt.Errorf("idempotent XADD to %s: script reply of %d elements, want 2", r.name, len(reply))
	}
	code, err1 := reply[0].AsInt64()
	id, err2 := reply[1].ToString()
	if err := errors.Join(err1, err2); err != nil {
		return "", false, fmt.Errorf("idempotent XADD to %s: unexpected script reply: %w", r.name, err)
	}
	if code != 0 && code != 1 {
		return "", false, fmt.Errorf("idempotent XADD to %s: unknown script reply code %d", r.name, code)
	}
	return id, code == 1, nil
}
