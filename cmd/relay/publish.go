package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

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
}

// Help is shown by relay publish --help.
func (c *PublishCmd) Help() string {
	return `Writes events to REDIS_STREAM the way Relay's producers should: one XADD per event with the field "event" (and "traceparent" with --trace), never a MAXLEN or MINID trim, which would lose entries no worker has read. Every event is checked first, as a worker decodes it; when any is not a JSON object nothing is written and the error names its line. The ids are printed one per line. Needs no consumer group.

Examples:

    relay publish '{"type":"orders.placed","amount":42}'
    echo '{"type":"orders.placed"}' | relay publish
    relay publish --file events.ndjson --rate 50 --count 10`
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
	rc, err := g.redisClient()
	if err != nil {
		return err
	}
	defer rc.Close()
	p, err := producer.New(producer.Redis(rc, g.RedisStream), producer.WithMaxEventBytes(int(c.MaxEventBytes)))
	if err != nil {
		return err
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
