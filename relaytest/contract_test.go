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
	_ relay.GroupEnsurer    = (*relaytest.Consumer)(nil)
	_ relay.PendingReporter = (*relaytest.Consumer)(nil)
	_ relay.OwnerChecker    = (*relaytest.Consumer)(nil)
	_ relay.Pinger          = (*relaytest.Consumer)(nil)
	_ relaytest.DLQWriter   = (*relaytest.DLQ)(nil)
	_ relaytest.DLQReader   = (*relaytest.DLQ)(nil)
	_ relay.Runner          = (*relaytest.Runner)(nil)
)

// start is where the fakes' manual clocks begin.
var start = time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)

func TestStateStoreContract(t *testing.T) {
	relaytest.TestStateStore(t, func(t *testing.T) relaytest.StateStoreHarness {
		clock := relaytest.NewManualClock(start)
		return stateHarness(t, clock, relaytest.AdvanceManual(clock), time.Minute)
	})
}

// The suites also hold on the system clock, inside a synctest bubble or not.
func TestStateStoreContractSystemClock(t *testing.T) {
	relaytest.TestStateStore(t, func(t *testing.T) relaytest.StateStoreHarness {
		now := func(*testing.T) time.Time { return time.Now() }
		return stateHarness(t, relaytest.SystemClock{}, relaytest.AdvanceByPolling(now), 50*time.Millisecond)
	})
}

// stateHarness returns a StateStoreHarness of a fake StateStore on clock,
// settling on a Stream of its own (WithStream) and writing dead letters to
// a DLQ of its own (WithDLQ), as redisstate.Store does on one Redis.
func stateHarness(t *testing.T, clock relaytest.Clock, advance func(*testing.T, time.Duration), short time.Duration) relaytest.StateStoreHarness {
	name := relaytest.UniqueName(t)
	src := relaytest.NewStream(relaytest.WithClock(clock), relaytest.WithBlock(time.Millisecond))
	dead := relaytest.NewDLQ(name, relaytest.WithClock(clock))
	tokens := &nextToken{}
	store := relaytest.NewStateStore(relaytest.WithClock(clock), relaytest.WithStream(src), relaytest.WithDLQ(dead),
		relaytest.WithTokenSource(tokens.token))
	reader := src.Consumer("reader")
	readAll := func(t *testing.T) {
		t.Helper()
		if _, err := reader.Read(t.Context(), 1000); err != nil {
			t.Fatalf("read: %v", err)
		}
	}
	return relaytest.StateStoreHarness{
		Store:      store,
		ClaimToken: tokens.set,
		Now:        func(*testing.T) time.Time { return clock.Now() },
		Advance:    advance,
		Short:      short,
		Deliver: func(t *testing.T) invocation.Key {
			t.Helper()
			id, err := src.Publish(t.Context(), map[string]string{"event": "{}"})
			if err != nil {
				t.Fatal(err)
			}
			readAll(t)
			return invocation.Key{Stream: name, Group: "group", MessageID: id}
		},
		Ack: func(t *testing.T, k invocation.Key) {
			t.Helper()
			if err := reader.Ack(t.Context(), k.MessageID); err != nil {
				t.Fatal(err)
			}
		},
		Pending: func(_ *testing.T, k invocation.Key) bool { return src.IsPending(k.MessageID) },
		State:   func(_ *testing.T, k invocation.Key) map[string]string { return store.Get(k) },
		DeadLetters: func(t *testing.T, _ invocation.Key) []dlq.Entry {
			t.Helper()
			entries, err := dead.List(t.Context(), dlq.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			return entries
		},
		Redeliver: func(t *testing.T, _ invocation.Key) {
			t.Helper()
			if err := src.SetID("0-0"); err != nil {
				t.Fatal(err)
			}
			readAll(t)
		},
	}
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
			Ack: func(t *testing.T, ids ...string) {
				t.Helper()
				if err := s.Consumer("settler").Ack(t.Context(), ids...); err != nil {
					t.Fatal(err)
				}
			},
			Delete:  func(_ *testing.T, ids ...string) { s.Delete(ids...) },
			Advance: relaytest.AdvanceManual(clock),
			Short:   time.Minute,
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
			Reader: d,
			Stream: name,
			Now:    func(*testing.T) time.Time { return clock.Now() },
		}
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
