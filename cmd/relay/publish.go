package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/producer"
)

// publishBatch is how many entries one pipelined round trip writes when no
// --rate paces them.
const publishBatch = 100

// PublishCmd is `relay publish` (docs/producing.md#relay-publish).
type PublishCmd struct {
	Event rawString `arg:"" optional:"" placeholder:"JSON" help:"The event, a JSON object. Without it (and without --file) one event is read from stdin."`
	File  string    `short:"f" placeholder:"FILE" help:"Publish every line of this file as one event (newline-delimited JSON; blank lines are skipped; - for stdin)."`
	Count int       `default:"1" help:"Publish the input this many times over."`
	Rate  float64   `placeholder:"N" help:"At most N events per second (0: as fast as Redis takes them, 100 per round trip)."`
	Trace string    `placeholder:"TRACEPARENT" env:"TRACEPARENT" help:"W3C traceparent to put on every entry, so the workers' spans continue that trace."`
	// MaxEventBytes is the workers' limit; a larger event is refused.
	MaxEventBytes byteSize `name:"max-event-bytes" env:"MAX_EVENT_BYTES" default:"1MiB" help:"The workers' MAX_EVENT_BYTES: a larger event is refused, since they would dead-letter it undecoded."`
	// IdempotencyKey and IdempotencyWindow are pointers so that an empty
	// key, or a window without a key, is refused rather than ignored.
	IdempotencyKey    *string        `name:"idempotency-key" placeholder:"KEY" help:"Publish at most once per KEY within the window: a repeat adds nothing and prints the first publish's id. With --file, the n-th event of the file uses KEY:n. Not with --count > 1."`
	IdempotencyWindow *time.Duration `name:"idempotency-window" placeholder:"DURATION" help:"How long --idempotency-key is remembered, from the publish that added the event: 1s to 720h (default 24h)."`
}

// Help is shown by relay publish --help.
func (c *PublishCmd) Help() string {
	return `Writes events to REDIS_STREAM the way Relay's producers should: one XADD per event with the field "event" (and "traceparent" with --trace), never a MAXLEN or MINID trim, which would lose entries no worker has read. Every event is checked first, as a worker decodes it; when any is not a JSON object nothing is written and the error names its line. The ids are printed one per line. Needs no consumer group.

With --idempotency-key a repeat of the same publish within the window (24h) adds nothing: its id is the first publish's, and stderr says it was a duplicate. With --file (or -f -), the n-th event of the input is keyed KEY:n, blank lines not counted, so running the same command again publishes only what is missing; --count > 1 is refused.

Examples:

    relay publish '{"type":"orders.placed","amount":42}'
    echo '{"type":"orders.placed"}' | relay publish
    relay publish --file events.ndjson --rate 50 --count 10
    relay publish --idempotency-key order-7 '{"type":"orders.placed","order_id":7}'`
}

// Run validates every input event, then publishes them.
func (c *PublishCmd) Run(ctx context.Context, g *Globals) error {
	if c.Count < 1 {
		return usagef("--count must be at least 1, got %d", c.Count)
	}
	if c.Rate < 0 {
		return usagef("--rate must be >= 0 (0: unpaced), got %g", c.Rate)
	}
	if c.Event != "" && c.File != "" {
		return usagef("give the event as an argument or --file, not both")
	}
	if err := c.checkIdempotency(); err != nil {
		return err
	}
	ctx, err := c.traceContext(ctx)
	if err != nil {
		return err
	}
	if err := g.requireStream(false); err != nil {
		return err
	}
	events, err := c.readEvents(int(c.MaxEventBytes))
	if err != nil {
		return err
	}
	if err := c.checkEventKeys(len(events)); err != nil {
		return err
	}
	rc, err := g.redisClient()
	if err != nil {
		return err
	}
	defer rc.Close()
	p, err := producer.New(producer.Redis(rc, g.RedisStream), producer.WithMaxEventBytes(int(c.MaxEventBytes)),
		producer.WithIdempotencyWindow(c.window()))
	if err != nil {
		return err
	}
	if c.IdempotencyKey != nil {
		return c.publishOnce(ctx, p, events, g.stdout, g.stderr)
	}
	return c.publish(ctx, p, events, g.stdout)
}

// traceContext returns ctx carrying --trace as its remote parent span.
func (c *PublishCmd) traceContext(ctx context.Context) (context.Context, error) {
	if c.Trace == "" {
		return ctx, nil
	}
	ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": c.Trace})
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil, usagef("--trace (TRACEPARENT) %q is not a W3C traceparent (00-<32 hex trace id>-<16 hex span id>-<2 hex flags>)", c.Trace)
	}
	return ctx, nil
}

// readEvents returns the events of the input, each checked as a worker
// decodes it.
func (c *PublishCmd) readEvents(maxBytes int) ([][]byte, error) {
	switch {
	case c.Event != "":
		return checked([][]byte{[]byte(c.Event)}, "the argument", maxBytes)
	case c.File == "":
		if st, err := os.Stdin.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			return nil, usagef("no event: give it as an argument or --file FILE, or pipe it on stdin")
		}
		b, err := readLimited(os.Stdin, "stdin")
		if err != nil {
			return nil, err
		}
		ev := bytes.TrimSpace(bytes.TrimPrefix(b, utf8BOM))
		if len(ev) == 0 {
			return nil, usagef("stdin holds no event")
		}
		return checked([][]byte{ev}, "stdin", maxBytes)
	case c.File == "-":
		return readLines(os.Stdin, "stdin", maxBytes)
	}
	f, err := os.Open(c.File)
	if err != nil {
		return nil, usagef("--file: %v", err)
	}
	defer f.Close()
	return readLines(f, c.File, maxBytes)
}

// checked returns events when each is valid, else an error naming from.
func checked(events [][]byte, from string, maxBytes int) ([][]byte, error) {
	if err := producer.ValidateWithin(events[0], maxBytes); err != nil {
		return nil, fmt.Errorf("%s: %w; nothing published", from, err)
	}
	return events, nil
}

// utf8BOM is the byte-order mark some editors put at the start of a UTF-8
// file: an encoding mark, not part of the first event.
var utf8BOM = []byte("\xef\xbb\xbf")

// readLines returns the non-blank lines of r, each a valid event; the
// first invalid one is named by name:line and nothing is returned.
func readLines(r io.Reader, name string, maxBytes int) ([][]byte, error) {
	sc := bufio.NewScanner(io.LimitReader(r, maxEventBytes+1))
	sc.Buffer(make([]byte, 64<<10), maxEventBytes)
	var events [][]byte
	read := 0
	for line := 1; sc.Scan(); line++ {
		read += len(sc.Bytes()) + 1
		ev := sc.Bytes()
		if line == 1 {
			ev = bytes.TrimPrefix(ev, utf8BOM)
		}
		ev = bytes.TrimSpace(ev)
		if len(ev) == 0 {
			continue
		}
		if err := producer.ValidateWithin(ev, maxBytes); err != nil {
			return nil, fmt.Errorf("%s:%d: %w; nothing published", name, line, err)
		}
		events = append(events, bytes.Clone(ev))
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) || read > maxEventBytes {
			return nil, usagef("%s is larger than %d MiB; split it", name, maxEventBytes>>20)
		}
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if read > maxEventBytes {
		return nil, usagef("%s is larger than %d MiB; split it", name, maxEventBytes>>20)
	}
	if len(events) == 0 {
		return nil, usagef("%s holds no event", name)
	}
	return events, nil
}

// publish writes events Count times over, paced by Rate, printing each id.
func (c *PublishCmd) publish(ctx context.Context, p *producer.Producer, events [][]byte, out io.Writer) error {
	batch, every := publishBatch, time.Duration(0)
	if c.Rate > 0 {
		batch, every = 1, time.Duration(float64(time.Second)/c.Rate)
	}
	all := make([][]byte, 0, len(events)*c.Count)
	for range c.Count {
		all = append(all, events...)
	}
	next, total, done := time.Now(), len(all), 0
	for len(all) > 0 {
		n := min(batch, len(all))
		if every > 0 {
			if err := sleepUntil(ctx, next); err != nil {
				return err
			}
			next = next.Add(every)
		}
		ids, err := p.PublishBatch(ctx, all[:n])
		for _, id := range ids {
			if _, werr := fmt.Fprintln(out, id); werr != nil {
				return werr
			}
		}
		if done += len(ids); err != nil {
			// Say where to resume: the events are in input order, Count
			// passes over them.
			return fmt.Errorf("%w; published %d of %d (the ids above), the next is event %d of pass %d",
				err, done, total, done%len(events)+1, done/len(events)+1)
		}
		all = all[n:]
	}
	return nil
}

// window is --idempotency-window or its default.
func (c *PublishCmd) window() time.Duration {
	if c.IdempotencyWindow == nil {
		return producer.DefaultIdempotencyWindow
	}
	return *c.IdempotencyWindow
}

// checkIdempotency refuses idempotency flags that cannot mean what they
// say, before anything is read or written.
func (c *PublishCmd) checkIdempotency() error {
	if c.IdempotencyKey == nil {
		if c.IdempotencyWindow != nil {
			return usagef("--idempotency-window needs --idempotency-key")
		}
		return nil
	}
	if c.Count > 1 {
		return usagef("--idempotency-key publishes each event once, --count %d repeats it on purpose: drop one of them", c.Count)
	}
	// Each flag on its own, so the error names the one that is wrong.
	if err := producer.ValidateIdempotency(*c.IdempotencyKey, producer.DefaultIdempotencyWindow); err != nil {
		return usagef("--idempotency-key: %s", bareIdempotencyError(err))
	}
	if err := producer.ValidateIdempotency("key", c.window()); err != nil {
		return usagef("--idempotency-window: %s", bareIdempotencyError(err))
	}
	return nil
}

// checkEventKeys refuses a --file run whose last event's key, the longest
// (KEY:<n>), is over the limit, before anything is written.
func (c *PublishCmd) checkEventKeys(n int) error {
	if c.IdempotencyKey == nil {
		return nil
	}
	if err := producer.ValidateIdempotency(c.eventKey(n-1), c.window()); err != nil {
		from := c.File
		if from == "-" {
			from = "stdin"
		}
		return usagef("--idempotency-key: the key of event %d of %s, %q: %s; nothing published", n, from, c.eventKey(n-1), bareIdempotencyError(err))
	}
	return nil
}

func bareIdempotencyError(err error) string {
	return strings.TrimPrefix(err.Error(), producer.ErrInvalidIdempotency.Error()+": ")
}

// eventKey is the idempotency key of event i (0-based) of the input: the
// key as given for an argument or stdin, KEY:<i+1> for the events of
// --file, so that each line of a file is published once.
func (c *PublishCmd) eventKey(i int) string {
	if c.File == "" {
		return *c.IdempotencyKey
	}
	return *c.IdempotencyKey + ":" + strconv.Itoa(i+1)
}

// publishOnce publishes each event once per its key (eventKey), paced by
// Rate, printing each id, new or the first publish's; stderr says which
// were duplicates, also when Redis fails midway.
func (c *PublishCmd) publishOnce(ctx context.Context, p *producer.Producer, events [][]byte, out, errOut io.Writer) error {
	every := time.Duration(0)
	if c.Rate > 0 {
		every = time.Duration(float64(time.Second) / c.Rate)
	}
	var dups []string
	defer func() { reportDuplicates(errOut, dups, c.window()) }()
	next := time.Now()
	for i, ev := range events {
		if every > 0 {
			if err := sleepUntil(ctx, next); err != nil {
				return err
			}
			next = next.Add(every)
		}
		id, first, err := p.PublishOnceJSON(ctx, c.eventKey(i), ev)
		if err != nil {
			return fmt.Errorf("%w; %d of %d done (the ids above), the next is event %d; the same command run again publishes only the rest",
				err, i, len(events), i+1)
		}
		if !first {
			dups = append(dups, c.eventKey(i))
		}
		if _, err := fmt.Fprintln(out, id); err != nil {
			return err
		}
	}
	return nil
}

// reportDuplicates says on w which publishes were duplicates: the key of
// a lone one, or how many and the first few keys.
func reportDuplicates(w io.Writer, dups []string, window time.Duration) {
	switch len(dups) {
	case 0:
		return
	case 1:
		fmt.Fprintf(w, "relay: duplicate: idempotency key %q was published within the last %s; nothing added, the id printed is the first publish's\n", dups[0], app.FormatDuration(window))
		return
	}
	const shown = 5
	names := make([]string, 0, shown)
	for _, k := range dups[:min(len(dups), shown)] {
		names = append(names, strconv.Quote(k))
	}
	more := ""
	if len(dups) > shown {
		more = fmt.Sprintf(" and %d more", len(dups)-shown)
	}
	fmt.Fprintf(w, "relay: %d duplicates: idempotency keys %s%s were published within the last %s; nothing added for them, the ids printed are the first publishes'\n",
		len(dups), strings.Join(names, ", "), more, app.FormatDuration(window))
}

// sleepUntil waits until t or ctx ends.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
