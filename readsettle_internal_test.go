package relay

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay/invocation"
)

// fakeBatchSettler records the message ids of each batch and answers every
// lease with err.
type fakeBatchSettler struct {
	Settler
	mu      sync.Mutex
	batches [][]string
	err     error
}

func (f *fakeBatchSettler) FinishSettleBatch(_ context.Context, ls []invocation.Lease, _ time.Duration) []error {
	ids := make([]string, len(ls))
	errs := make([]error, len(ls))
	for i, l := range ls {
		ids[i], errs[i] = l.Key.MessageID, f.err
	}
	f.mu.Lock()
	f.batches = append(f.batches, ids)
	f.mu.Unlock()
	return errs
}

func (f *fakeBatchSettler) seen() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]string(nil), f.batches...)
}

func leaseOfID(id string) invocation.Lease {
	return invocation.Lease{Key: invocation.Key{Stream: "s", Group: "g", MessageID: id}, Field: "a/h", Attempt: 1, Token: "t"}
}

// TestReadSettlesLingerAndCancel: a settlement waits at most the linger
// for the rest of its read; one whose context ends while it waits is taken
// out of the batch, settles nothing and says why; a batch's answer reaches
// every member.
func TestReadSettlesLingerAndCancel(t *testing.T) {
	f := &fakeBatchSettler{err: errors.New("injected")}
	g := &readSettles{bs: f, linger: 300 * time.Millisecond, open: 4}

	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() { cancelled <- g.join(ctx, &queuedSettle{l: leaseOfID("1-1")}) }()
	for f.seen() == nil && func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.queued) == 0 }() {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("join whose context ended while queued = %v; want context.Canceled", err)
	}

	start := time.Now()
	if err := g.join(context.Background(), &queuedSettle{l: leaseOfID("1-2")}); err == nil || err.Error() != "injected" {
		t.Errorf("join = %v; want the batch's answer", err)
	}
	if waited := time.Since(start); waited < g.linger {
		t.Errorf("the batch went after %s with two members open; want it to wait for the linger (%s)", waited, g.linger)
	}
	g.leave()
	if err := g.join(context.Background(), &queuedSettle{l: leaseOfID("1-3")}); err == nil {
		t.Error("the last member's join = nil; want the batch's answer")
	}
	if got := f.seen(); len(got) != 2 || len(got[0]) != 1 || got[0][0] != "1-2" || len(got[1]) != 1 || got[1][0] != "1-3" {
		t.Errorf("batches = %v; want [1-2] after the linger, then [1-3] at once, and never the cancelled 1-1", got)
	}
}
