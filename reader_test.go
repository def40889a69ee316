package relay_test

import (
	"context"
	"fmt"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
)

// TestRunLeavesNoMessageGoroutines: goroutines that handle message after
// message (handleLoop) belong to Run, which returns only after every one
// of them, busy or idle, has exited.
func TestRunLeavesNoMessageGoroutines(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	release := make(chan struct{})
	h.handle("users/events.created", func(context.Context, runtime.Request) error {
		<-release
		return nil
	})
	stop := h.start("c1")
	for i := range 40 {
		h.publish("event", fmt.Sprintf(`{"event_name":"INSERT","table_name":"users","id":%d}`, i))
	}
	testutil.WaitFor(t, 10*time.Second, "a handler running", func() bool { return h.calls.Count("users/events.created") > 0 })
	if n := countGoroutines("relay.(*dispatcher).handleLoop"); n == 0 {
		t.Fatal("no message goroutine while a handler runs: the test no longer sees them")
	}
	close(release)
	testutil.WaitFor(t, 10*time.Second, "every message acknowledged", func() bool { return h.settled() })
	if got := h.calls.Count("users/events.created"); got != 40 {
		t.Fatalf("handler ran %d times for 40 messages", got)
	}
	stop()
	if n := countGoroutines("relay.(*dispatcher).handleLoop"); n != 0 {
		t.Errorf("%d message goroutines left after Run returned", n)
	}
}

// countGoroutines counts the goroutines whose stack mentions fn.
func countGoroutines(fn string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:goruntime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

// TestIdleReaderLeavesSlotsToReclaim: while the stream has nothing new, the
// reader's blocking XREADGROUP holds one message slot, not all of them, so
// entries reclaimed from a dead consumer start at once instead of waiting
// for the block (8s here) to end.
func TestIdleReaderLeavesSlotsToReclaim(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	ctx := context.Background()
	const n = 10
	for i := range n {
		h.publish("event", fmt.Sprintf(`{"event_name":"INSERT","table_name":"users","id":%d}`, i))
	}
	dead := redisstream.New(h.rc, h.stream, h.group, "dead")
	if msgs, err := dead.Read(ctx, n); err != nil || len(msgs) != n {
		t.Fatalf("dead consumer read %d, %v; want %d", len(msgs), err, n)
	}
	h.handle("users/events.created", nil)
	h.source = redisstream.New(h.rc, h.stream, h.group, "c1", redisstream.WithBlock(8*time.Second))
	h.start("c1")
	testutil.WaitFor(t, 6*time.Second, "the reclaimed entries handled while the reader blocks", func() bool { return h.settled() })
	if got := h.calls.Count("users/events.created"); got != n {
		t.Errorf("handler ran %d times for %d entries", got, n)
	}
}
