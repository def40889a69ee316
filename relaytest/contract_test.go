package relaytest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaydev/relay/app"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
)

var (
	_ relay.StateStore      = (*relaytest.StateStore)(nil)
	_ relay.ClaimVoider     = (*relaytest.StateStore)(nil)
	_ relay.StreamSource    = (*relaytest.Consumer)(nil)
	_ relay.PendingReporter = (*relaytest.Consumer)(nil)
	_ relay.OwnerChecker    = (*relaytest.Consumer)(nil)
	_ relay.Pinger          = (*relaytest.Consumer)(nil)
	_ relay.DLQWriter       = (*relaytest.DLQ)(nil)
	_ relay.Runner          = (*relaytest.Runner)(nil)
)

// start is where the fakes' manual clocks begin.
var start = time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)

func TestStateStoreContract(t *testing.T) {
	relaytest.TestStateStore(t, func(t *testing.T) relaytest.StateStoreHarness {
		clock := relaytest.NewManualClock(start)
		p := newPEL(t)
		h := p.harness()
		tokens := &nextToken{}
		h.Store = relaytest.NewStateStore(relaytest.WithClock(clock), relaytest.WithPending(p.has), relaytest.WithTokenSource(tokens.token))
		h.ClaimToken = tokens.set
		h.Now = func(*testing.T) time.Time { return clock.Now() }
		h.Advance, h.Short = relaytest.AdvanceManual(clock), time.Minute
		return h
	})
}

// nextToken is a claim token source whose next token a test may choose
// (StateStoreHarness.ClaimToken); otherwise its tokens are random.
type nextToken struct {
	mu   sync.Mutex
	next string
}

func (n *nextToken) set(_ *testing.T, token string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next = token
}

func (n *nextToken) token() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if tok := n.next; tok != "" {
		n.next = ""
		return tok
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// pel is a consumer group's PEL for the StateStore harnesses: the messages
// Deliver adds are pending until Ack, and again after Redeliver.
type pel struct {
	stream string
	mu     sync.Mutex
	n      int
	ids    map[invocation.Key]bool
}

func newPEL(t *testing.T) *pel {
	return &pel{stream: relaytest.UniqueName(t), ids: map[invocation.Key]bool{}}
}

func (p *pel) has(k invocation.Key) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ids[k]
}

func (p *pel) set(k invocation.Key, pending bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ids[k] = pending
}

// harness returns a StateStoreHarness with Deliver, Ack and Redeliver on p.
func (p *pel) harness() relaytest.StateStoreHarness {
	return relaytest.StateStoreHarness{
		Deliver: func(*testing.T) invocation.Key {
			p.mu.Lock()
			p.n++
			k := invocation.Key{Stream: p.stream, Group: "group", MessageID: "1700000000000-" + strconv.Itoa(p.n)}
			p.mu.Unlock()
			p.set(k, true)
			return k
		},
		Ack:       func(_ *testing.T, k invocation.Key) { p.set(k, false) },
		Redeliver: func(_ *testing.T, k invocation.Key) { p.set(k, true) },
	}
}

func TestStreamSourceContract(t *testing.T) {
	relaytest.TestStreamSource(t, func(t *testing.T) relaytest.StreamSourceHarness {
		clock := relaytest.NewManualClock(start)
		s := relaytest.NewStream(relaytest.WithClock(clock), relaytest.WithBlock(10*time.Millisecond))
		return relaytest.StreamSourceHarness{
			Publish: func(t *testing.T, fields map[string]string) string {
				id, err := s.Publish(t.Context(), fields)
				if err != nil {
					t.Fatal(err)
				}
				return id
			},
			Consumer: func(_ *testing.T, name string) relay.StreamSource { return s.Consumer(name) },
			Delete:   func(_ *testing.T, ids ...string) { s.Delete(ids...) },
			Advance:  relaytest.AdvanceManual(clock),
			Short:    time.Minute,
		}
	})
}

func TestDLQWriterContract(t *testing.T) {
	relaytest.TestDLQWriter(t, func(t *testing.T) relaytest.DLQWriterHarness {
		clock := relaytest.NewManualClock(start)
		name := relaytest.UniqueName(t)
		d := relaytest.NewDLQ(name, relaytest.WithClock(clock))
		return relaytest.DLQWriterHarness{
			Writer: d,
			Stream: name,
			List: func(t *testing.T) []dlq.Entry {
				t.Helper()
				entries, err := d.List(context.Background(), dlq.Filter{})
				if err != nil {
					t.Fatal(err)
				}
				return entries
			},
			Now: func(*testing.T) time.Time { return clock.Now() },
		}
	})
}

// The suites also hold on the system clock, inside a synctest bubble or not.
func TestStateStoreContractSystemClock(t *testing.T) {
	relaytest.TestStateStore(t, func(t *testing.T) relaytest.StateStoreHarness {
		now := func(*testing.T) time.Time { return time.Now() }
		p := newPEL(t)
		h := p.harness()
		tokens := &nextToken{}
		h.Store = relaytest.NewStateStore(relaytest.WithPending(p.has), relaytest.WithTokenSource(tokens.token))
		h.ClaimToken = tokens.set
		h.Now, h.Advance, h.Short = now, relaytest.AdvanceByPolling(now), 50*time.Millisecond
		return h
	})
}

func TestMatcherContract(t *testing.T) {
	relaytest.TestMatcher(t, func(_ *testing.T, apps *app.Set) relay.Matcher { return apps.Matcher() })
}

// The fake Runner passes the Runner suite when scripted with outcomes that
// behave as real handlers do.
func TestRunnerContract(t *testing.T) {
	relaytest.TestRunner(t, func(t *testing.T) relaytest.RunnerHarness {
		r := relaytest.NewRunner()
		var n atomic.Int32
		return relaytest.RunnerHarness{
			Runner: r,
			Request: func(t *testing.T, b relaytest.Behaviour) runtime.Request {
				// One handler per request, so each runs its own script.
				req := runtime.Request{App: "relaytest", Handler: "h" + strconv.Itoa(int(n.Add(1)))}
				var out relaytest.Reply
				switch b {
				case relaytest.Succeeds:
					out = relaytest.Succeed()
				case relaytest.Fails:
					out = relaytest.Fail(3, "failed")
				case relaytest.Hangs:
					out = relaytest.Hang()
				case relaytest.ChecksEvent:
					out = func(_ context.Context, req runtime.Request) error {
						if string(req.Event) != relaytest.CheckEvent {
							return &runtime.ExitError{Code: 1, Stderr: "unexpected event"}
						}
						return nil
					}
				}
				r.Script(req.App+"/"+req.Handler, out)
				return req
			},
		}
	})
}
