package relay_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/netfault"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/stream/redisstream"
)

// freezeOnClaim is the worker's store with a network that freezes (a black
// hole that holds the bytes, netfault) just as the first claim of a message
// other than the warm-up one is asked for, and thaws after thaw: the
// claim's script reaches Redis only after the worker gave up waiting for
// its reply.
type freezeOnClaim struct {
	*redisstate.Store
	proxy  *netfault.Proxy
	warmUp atomic.Value // string: the id of the message not to freeze on
	thaw   time.Duration
	once   sync.Once
	thawed chan struct{}
}

func (s *freezeOnClaim) Claim(ctx context.Context, reqs []invocation.ClaimRequest) []invocation.ClaimResult {
	warm, _ := s.warmUp.Load().(string)
	for _, r := range reqs {
		if warm != "" && r.Key.MessageID != warm {
			s.once.Do(func() {
				s.proxy.Blackhole()
				time.AfterFunc(s.thaw, func() { s.proxy.Heal(); close(s.thawed) })
			})
		}
	}
	return s.Store.Claim(ctx, reqs)
}

// TestLostClaimReplyChargesNothing: a claim whose reply is lost (the network
// froze after the worker sent it, and its script ran on Redis after the
// thaw) records a lease nobody uses. The worker knows the claim's token and
// gives it back uncharged once Redis answers, so the lease cannot expire
// into a charged attempt: with retries 0 the handler still runs, once, and
// nothing is dead-lettered (docs/delivery.md#lost-replies).
func TestLostClaimReplyChargesNothing(t *testing.T) {
	h := newHarness(t, map[string]string{"users": "image: x\nevents:\n  - {handler: users.welcome, pattern: {event_name: [INSERT]}, timeout: 1s, retries: 0}\n"})
	h.handle("users/users.welcome", nil)
	proxy, err := netfault.Start(redistest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	rc := redistest.Connect(t, proxy.Addr())
	frozen := &freezeOnClaim{Store: redisstate.New(rc), proxy: proxy, thaw: 2 * time.Second, thawed: make(chan struct{})}
	h.source = redisstream.New(rc, h.stream, h.group, "c1", redisstream.WithBlock(50*time.Millisecond))
	h.stateStore = frozen
	h.start("c1", writeTimeout(500*time.Millisecond))
	// A first message loads the scripts: a claim's EVALSHA that finds
	// none would not be followed by its EVAL once the worker stopped
	// waiting.
	frozen.warmUp.Store(h.publish("event", `{"event_name":"INSERT","table_name":"users"}`))
	testutil.WaitFor(t, 10*time.Second, "first message settled", h.settled)
	h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)

	select {
	case <-frozen.thawed:
	case <-time.After(30 * time.Second):
		t.Fatal("the second message was not claimed within 30s")
	}
	// The lease the late claim recorded (1 s timeout + 0.5 s grace) has
	// long expired by then, and the message is reclaimed.
	testutil.WaitFor(t, 20*time.Second, "message settled", h.settled)
	if es := h.dlqEntries(); len(es) != 0 {
		t.Errorf("dead-lettered without its handler having run: %+v", es)
	}
	if got := h.calls.Count("users/users.welcome"); got != 2 {
		t.Errorf("handler ran %d times, want 2 (once per message)", got)
	}
	if runs := h.calls.Get("users/users.welcome"); len(runs) == 2 && runs[1].Attempt != 1 {
		t.Errorf("the handler ran as attempt %d, want 1: the claim whose reply was lost must not be charged", runs[1].Attempt)
	}
}
