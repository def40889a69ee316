package relay_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
)

// failingAck fails the first Ack of each id, as if the worker crashed
// after the DLQ write and before the XACK.
type failingAck struct {
	relay.StreamSource
	mu     sync.Mutex
	failed map[string]bool
}

func (f *failingAck) Ack(ctx context.Context, ids ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if !f.failed[id] {
			f.failed[id] = true
			return errors.New("injected: crash before XACK")
		}
	}
	return f.StreamSource.Ack(ctx, ids...)
}

func TestDLQWriteIsIdempotentAcrossCrashBeforeAck(t *testing.T) {
	h := newHarness(t, map[string]string{"billing": billingApp})
	h.handle("billing/charges.fail", func(context.Context, runtime.Request) error { return errors.New("declined") })
	h.handle("billing/charges.audit", nil)
	h.source = &failingAck{StreamSource: h.src, failed: map[string]bool{}}
	h.start("c1")
	h.publish("event", `{"kind":"charge"}`)
	testutil.WaitFor(t, 10*time.Second, "ack on redelivery", func() bool { return h.settled() })
	if n := len(h.dlqEntries()); n != 1 {
		t.Errorf("%d DLQ entries after a crash between DLQ write and ack, want 1", n)
	}
	if h.calls.count("billing/charges.fail") != 1 || h.calls.count("billing/charges.audit") != 1 {
		t.Errorf("handlers ran again on redelivery: fail %d, audit %d", h.calls.count("billing/charges.fail"), h.calls.count("billing/charges.audit"))
	}
}
