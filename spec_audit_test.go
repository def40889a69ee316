package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/runtime"
)

// countingDLQ counts Write calls per "app/handler" and fails the first
// fail[k] writes of k.
type countingDLQ struct {
	relay.DLQWriter
	mu     sync.Mutex
	writes map[string]int
	fail   map[string]int
}

func (c *countingDLQ) Write(ctx context.Context, e dlq.Entry) (string, error) {
	k := e.App + "/" + e.Handler
	c.mu.Lock()
	c.writes[k]++
	if c.fail[k] > 0 {
		c.fail[k]--
		c.mu.Unlock()
		return "", errors.New("injected: DLQ write failed")
	}
	c.mu.Unlock()
	return c.DLQWriter.Write(ctx, e)
}

func (c *countingDLQ) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := map[string]int{}
	for k, v := range c.writes {
		m[k] = v
	}
	return m
}

// docs/delivery.md#dead-letter-queue: a redelivery skips entries already
// written (their :dlq marker) and writes only the missing ones. Counting
// Write calls is what shows it: dlq.Writer's own dedupe would hide a
// rewrite from a look at the DLQ stream alone.
func TestRedeliveryWritesOnlyTheMissingDLQEntries(t *testing.T) {
	h := newHarness(t, map[string]string{"a": `
image: x
events:
  - {handler: h.one, pattern: {kind: [x]}, retries: 0}
  - {handler: h.two, pattern: {kind: [x]}, retries: 0}
`})
	fail := func(context.Context, runtime.Request) error { return errors.New("no") }
	h.handle("a/h.one", fail)
	h.handle("a/h.two", fail)
	// h.one's entry is written on the first delivery; h.two's write fails
	// once, so the message stays pending and comes back.
	c := &countingDLQ{DLQWriter: h.dlqw, writes: map[string]int{}, fail: map[string]int{"a/h.two": 1}}
	h.dlqw = c
	h.start("c1")
	id := h.publish("event", `{"kind":"x"}`)
	waitFor(t, 5*time.Second, "written on redelivery, then acked", func() bool { return h.settled() && len(h.dlqEntries()) == 2 })

	if got, want := fmt.Sprint(c.counts()), fmt.Sprint(map[string]int{"a/h.one": 1, "a/h.two": 2}); got != want {
		t.Errorf("DLQ writes = %s, want %s: the redelivery must skip h.one, whose entry is marked written", got, want)
	}
	got := map[string]dlq.Entry{}
	for _, e := range h.dlqEntries() {
		got[e.App+"/"+e.Handler] = e
	}
	if len(got) != 2 || got["a/h.one"].OriginalID != id || got["a/h.two"].OriginalID != id {
		t.Errorf("DLQ entries = %+v, want one each for a/h.one and a/h.two", got)
	}
	if d := got["a/h.two"].Deliveries; d < 2 {
		t.Errorf("h.two's entry has deliveries %d; it can only have been written on a redelivery", d)
	}
	if h.calls.count("a/h.one") != 1 || h.calls.count("a/h.two") != 1 {
		t.Errorf("runs: h.one %d, h.two %d, want 1 each", h.calls.count("a/h.one"), h.calls.count("a/h.two"))
	}
}
