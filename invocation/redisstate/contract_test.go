package redisstate_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/relaytest"
)

// TestStoreContract runs the shared relay.StateStore suite against Store on
// the shared redis-server. Leases, backoffs and TTLs run on the server's
// clock, so the suite's short durations pass for real.
func TestStoreContract(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t)
	var tokens atomic.Uint64 // claim tokens, unique across the sub-tests
	now := func(t *testing.T) time.Time { return redistest.ServerTime(t, c) }
	relaytest.TestStateStore(t, func(t *testing.T) relaytest.StateStoreHarness {
		stream := redistest.Name(t, "stream")
		// A Store of the sub-test's own, whose next claim token ClaimToken
		// may choose.
		var mu sync.Mutex
		var next string
		store := redisstate.New(c, redisstate.WithTokenSource(func() string {
			mu.Lock()
			defer mu.Unlock()
			if tok := next; tok != "" {
				next = ""
				return tok
			}
			return strconv.FormatUint(tokens.Add(1), 36) + "t"
		}))
		dead := redisdlq.NewStore(c, stream)
		return relaytest.StateStoreHarness{
			Store: store,
			ClaimToken: func(_ *testing.T, token string) {
				mu.Lock()
				defer mu.Unlock()
				next = token
			},
			Now:     now,
			Advance: relaytest.AdvanceByPolling(now),
			Short:   200 * time.Millisecond,
			Deliver: func(t *testing.T) invocation.Key {
				t.Helper()
				ctx := t.Context()
				res := c.DoMulti(ctx,
					c.B().Xadd().Key(stream).Id("*").FieldValue().FieldValue("event", "{}").Build(),
					c.B().XgroupCreate().Key(stream).Group("group").Id("0").Build())
				id, err := res[0].ToString()
				if err != nil {
					t.Fatalf("XADD: %v", err)
				}
				if err := res[1].Error(); err != nil && !rueidis.IsRedisBusyGroup(err) {
					t.Fatalf("XGROUP CREATE: %v", err)
				}
				readAll(t, c, stream)
				return invocation.Key{Stream: stream, Group: "group", MessageID: id}
			},
			Ack: func(t *testing.T, k invocation.Key) {
				t.Helper()
				if err := c.Do(t.Context(), c.B().Xack().Key(k.Stream).Group(k.Group).Id(k.MessageID).Build()).Error(); err != nil {
					t.Fatalf("XACK: %v", err)
				}
			},
			Pending: func(t *testing.T, k invocation.Key) bool { return pending(t, c, k) },
			State: func(t *testing.T, k invocation.Key) map[string]string {
				t.Helper()
				m, err := store.Get(t.Context(), k)
				if err != nil {
					t.Fatal(err)
				}
				return m
			},
			DeadLetters: func(t *testing.T, _ invocation.Key) []dlq.Entry {
				t.Helper()
				entries, err := dead.List(t.Context(), dlq.Filter{})
				if err != nil {
					t.Fatalf("dead letters: %v", err)
				}
				return entries
			},
			Redeliver: func(t *testing.T, k invocation.Key) {
				t.Helper()
				if err := c.Do(t.Context(), c.B().XgroupSetid().Key(k.Stream).Group(k.Group).Id("0").Build()).Error(); err != nil {
					t.Fatalf("XGROUP SETID: %v", err)
				}
				readAll(t, c, k.Stream)
			},
		}
	})
}

// readAll delivers every new entry of stream to a consumer of "group".
func readAll(t *testing.T, c rueidis.Client, stream string) {
	t.Helper()
	err := c.Do(t.Context(), c.B().Xreadgroup().Group("group", "c").Count(1000).Streams().Key(stream).Id(">").Build()).Error()
	if err != nil {
		t.Fatalf("XREADGROUP: %v", err)
	}
}

// pending reports whether k's message is in its group's PEL (XPENDING).
func pending(t *testing.T, c rueidis.Client, k invocation.Key) bool {
	t.Helper()
	rows, err := c.Do(t.Context(), c.B().Xpending().Key(k.Stream).Group(k.Group).Start(k.MessageID).End(k.MessageID).Count(1).Build()).ToArray()
	if err != nil {
		t.Fatalf("XPENDING: %v", err)
	}
	return len(rows) > 0
}

// TestFakeStoreAgrees replays one sequence of claims and settlements,
// covering every value a field can hold, on Store and on
// relaytest.StateStore (settling on a relaytest.Stream, dead-lettering to
// a relaytest.DLQ) with the same claim tokens, and compares every result,
// the whole hash and the dead-letter entries after each step. Deadlines
// and entry ids come from different clocks and are compared by shape
// only; the contract suite checks their values.
func TestFakeStoreAgrees(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t)
	// Each store's claims take tokens tok1, tok2, ...; next tells the token
	// of a store's next claim, for a Void that comes before it.
	var claims sync.Map // relay.StateStore -> *atomic.Int64, its claims so far
	tokens := func() (func() string, *atomic.Int64) {
		n := new(atomic.Int64)
		return func() string { return "tok" + strconv.FormatInt(n.Add(1), 10) }, n
	}
	next := func(s relay.StateStore) string {
		n, _ := claims.Load(s)
		return "tok" + strconv.FormatInt(n.(*atomic.Int64).Load()+1, 10)
	}
	key := invocation.Key{Stream: redistest.Name(t, "stream"), Group: "group", MessageID: "1700000000000-0"}
	type store interface {
		relay.StateStore
		get(t *testing.T) map[string]string
		deadLetters(t *testing.T) []dlq.Entry
	}
	for _, r := range c.DoMulti(t.Context(),
		c.B().Xadd().Key(key.Stream).Id(key.MessageID).FieldValue().FieldValue("event", "{}").Build(),
		c.B().XgroupCreate().Key(key.Stream).Group(key.Group).Id("0").Build()) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	readAll(t, c, key.Stream)
	// The fake's stream holds the same message, by its clock.
	clock := relaytest.NewManualClock(time.UnixMilli(1_700_000_000_000))
	src := relaytest.NewStream(relaytest.WithClock(clock), relaytest.WithBlock(time.Millisecond))
	if id, err := src.Publish(t.Context(), map[string]string{"event": "{}"}); err != nil || id != key.MessageID {
		t.Fatalf("fake publish = %s, %v; want %s", id, err, key.MessageID)
	}
	consumer := src.Consumer("c")
	if _, err := consumer.Read(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	realTokens, realClaims := tokens()
	fakeTokens, fakeClaims := tokens()
	fakeDLQ := relaytest.NewDLQ(key.Stream, relaytest.WithClock(clock))
	real := redisStore{redisstate.New(c, redisstate.WithTokenSource(realTokens)), key, c}
	fake := fakeStore{relaytest.NewStateStore(relaytest.WithTokenSource(fakeTokens), relaytest.WithClock(clock),
		relaytest.WithStream(src), relaytest.WithDLQ(fakeDLQ)), key, fakeDLQ}
	claims.Store(relay.StateStore(real), realClaims)
	claims.Store(relay.StateStore(fake), fakeClaims)
	deadline := regexp.MustCompile(`^(running|next_attempt_at):\d+:`)
	normalize := func(m map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			if strings.HasPrefix(k, "__dlq:") {
				v = "<id>"
			}
			out[k] = deadline.ReplaceAllString(v, "$1:<ms>:")
		}
		return out
	}
	noIDs := func(es []dlq.Entry) []dlq.Entry {
		for i := range es {
			es[i].ID = ""
		}
		return es
	}
	// A step runs one call on a store and describes its result.
	type step struct {
		name string
		do   func(ctx context.Context, s store, leases map[string]invocation.Lease) string
	}
	claimReq := func(r invocation.ClaimRequest) func(context.Context, store, map[string]invocation.Lease) string {
		return func(ctx context.Context, s store, leases map[string]invocation.Lease) string {
			r.Key, r.Lease = key, time.Hour
			res := s.Claim(ctx, []invocation.ClaimRequest{r})[0]
			switch res.Status {
			case invocation.Claimed, invocation.Exhausted, invocation.DeadLettered:
				leases[r.Field] = res.Lease
			}
			return fmt.Sprintf("%v attempt=%d token=%s prev=%q lost=%d err=%v", res.Status, res.Lease.Attempt, res.Lease.Token, res.PrevTrace, res.Lost, errKind(res.Err))
		}
	}
	claim := func(f string, maxAttempts int) func(context.Context, store, map[string]invocation.Lease) string {
		return claimReq(invocation.ClaimRequest{Field: f, MaxAttempts: maxAttempts})
	}
	entry := func(l invocation.Lease) *dlq.Entry {
		app, handler := invocation.SplitField(l.Field)
		return &dlq.Entry{OriginalID: key.MessageID, Group: key.Group, Consumer: "c", Event: "{}", Reason: "failed",
			App: app, Handler: handler, Deliveries: 1, HandlerAttempts: l.Attempt, Timestamp: time.UnixMilli(1_700_000_000_123).UTC()}
	}
	// tr is a transition of kind with the latest lease of field f, with
	// trace.
	type tr struct {
		kind  invocation.TransitionKind
		f     string
		trace string
	}
	settle := func(ack bool, retention time.Duration, ts ...tr) func(context.Context, store, map[string]invocation.Lease) string {
		return func(ctx context.Context, s store, leases map[string]invocation.Lease) string {
			st := invocation.Settlement{Key: key, Ack: ack, Retention: retention}
			for _, x := range ts {
				l := leases[x.f]
				l.Trace = x.trace
				t := invocation.Transition{Kind: x.kind, Lease: l}
				if x.kind == invocation.Exhaust || x.kind == invocation.DeadLetter {
					t.Entry = entry(l)
				}
				st.Transitions = append(st.Transitions, t)
			}
			res := s.Settle(ctx, []invocation.Settlement{st})[0]
			out := "err=" + errKind(res.Err)
			for _, r := range res.Transitions {
				out += fmt.Sprintf(" next=%v entry=%v", !r.Next.IsZero(), r.DLQID != "")
			}
			return out
		}
	}
	cleared := func(retention time.Duration) func(context.Context, store, map[string]invocation.Lease) string {
		return func(ctx context.Context, s store, _ map[string]invocation.Lease) string {
			return "err=" + errKind(s.Settle(ctx, []invocation.Settlement{{Key: key, Cleared: true, Retention: retention}})[0].Err)
		}
	}
	void := func(f string) func(context.Context, store, map[string]invocation.Lease) string {
		return func(ctx context.Context, s store, leases map[string]invocation.Lease) string {
			return "err=" + errKind(s.(relay.ClaimVoider).Void(ctx, leases[f]))
		}
	}
	// voidNext voids the store's next claim of field f before it runs.
	voidNext := func(f string) func(context.Context, store, map[string]invocation.Lease) string {
		return func(ctx context.Context, s store, _ map[string]invocation.Lease) string {
			return "err=" + errKind(s.(relay.ClaimVoider).Void(ctx, invocation.Lease{Key: key, Field: f, Token: next(s)}))
		}
	}
	steps := []step{
		{"claim a", claim("a/h", 2)},
		{"claim b, recording c and e", claimReq(invocation.ClaimRequest{Field: "b/h", MaxAttempts: 3, Record: invocation.Record{Fields: []string{"c/h", "e/h"}, Complete: true}})},
		{"claim a again", claim("a/h", 2)},
		{"probe a, running", claimReq(invocation.ClaimRequest{Field: "a/h", MaxAttempts: 2, Probe: true})},
		{"retry a with lineage", settle(false, 0, tr{invocation.Retry, "a/h", "tr-a1"})},
		{"finish a, spent lease", settle(false, 0, tr{invocation.Finish, "a/h", ""})},
		{"claim a, attempt 2", claim("a/h", 2)},
		{"release a", settle(false, 0, tr{invocation.Release, "a/h", "tr-a2"})},
		{"claim a, attempt 2 again", claim("a/h", 2)},
		{"exhaust a", settle(false, 0, tr{invocation.Exhaust, "a/h", ""})},
		{"claim a, dead-lettered", claim("a/h", 2)},
		{"exhaust a again", settle(false, 0, tr{invocation.Exhaust, "a/h", "tr-again"})},
		{"dead-letter a, written", settle(false, 0, tr{invocation.DeadLetter, "a/h", ""})},
		{"probe c, recorded", claimReq(invocation.ClaimRequest{Field: "c/h", MaxAttempts: 1, Probe: true})},
		{"claim c, attempt 1", claim("c/h", 1)},
		{"retry c, the last", settle(false, 0, tr{invocation.Retry, "c/h", "tr-c1"})},
		{"probe c, exhausted", claimReq(invocation.ClaimRequest{Field: "c/h", MaxAttempts: 1, Probe: true})},
		{"dead-letter c", settle(false, 0, tr{invocation.DeadLetter, "c/h", "tr-ignored"})},
		{"release b", settle(false, 0, tr{invocation.Release, "b/h", "tr-b1"})},
		{"claim b, attempt 1 again", claim("b/h", 3)},
		{"finish b and a stale retry of a, atomic", settle(false, 0, tr{invocation.Finish, "b/h", ""}, tr{invocation.Retry, "a/h", ""})},
		{"void d before its claim, no state", voidNext("d/h")},
		{"claim d, voided", claim("d/h", 2)},
		{"claim d, attempt 1", claim("d/h", 2)},
		{"void d's claim", void("d/h")},
		{"void d's claim again", void("d/h")},
		{"void d before its claim, due", voidNext("d/h")},
		{"claim d, voided again", claim("d/h", 2)},
		{"claim d, attempt 1 again", claim("d/h", 2)},
		{"void a lost claim of d beside its lease", voidNext("d/h")},
		{"pin", func(ctx context.Context, s store, _ map[string]invocation.Lease) string {
			v, err := s.Pin(ctx, key, "__schedule", "first")
			w, err2 := s.Pin(ctx, key, "__schedule", "second")
			return fmt.Sprintf("%s %s err=%v %v", v, w, errKind(err), errKind(err2))
		}},
		{"cleared while pending", cleared(time.Hour)},
		{"claim e, attempt 1", claim("e/h", 1)},
		{"exhaust e and finish b, with the ack", settle(true, time.Hour, tr{invocation.Exhaust, "e/h", "tr-e1"}, tr{invocation.Finish, "b/h", ""})},
		{"claim b, terminal", claim("b/h", 3)},
		{"finish b again, terminal", settle(true, time.Hour, tr{invocation.Finish, "b/h", ""})},
		{"exhaust d, terminal", settle(false, 0, tr{invocation.Exhaust, "d/h", ""})},
		{"ack again, terminal", settle(true, time.Hour)},
		{"void d, terminal", void("d/h")},
		{"cleared, already retained", cleared(time.Hour)},
		{"cleared at retention 0 deletes", cleared(0)},
		{"claim c, still terminal", claim("c/h", 1)},
	}
	ctx := t.Context()
	leases := map[store]map[string]invocation.Lease{real: {}, fake: {}}
	for _, st := range steps {
		want := st.do(ctx, real, leases[real])
		got := st.do(ctx, fake, leases[fake])
		if want != got {
			t.Errorf("%s: Store %s, fake %s", st.name, want, got)
		}
		if diff := cmp.Diff(normalize(real.get(t)), normalize(fake.get(t))); diff != "" {
			t.Fatalf("%s: hash (-Store +fake):\n%s", st.name, diff)
		}
		if diff := cmp.Diff(noIDs(real.deadLetters(t)), noIDs(fake.deadLetters(t))); diff != "" {
			t.Fatalf("%s: dead letters (-Store +fake):\n%s", st.name, diff)
		}
		if p, q := pending(t, c, key), src.IsPending(key.MessageID); p != q {
			t.Fatalf("%s: the message is pending %v on Redis, %v on the fake", st.name, p, q)
		}
	}
}

type redisStore struct {
	*redisstate.Store
	key invocation.Key
	c   rueidis.Client
}

func (s redisStore) get(t *testing.T) map[string]string {
	t.Helper()
	m, err := s.Get(t.Context(), s.key)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (s redisStore) deadLetters(t *testing.T) []dlq.Entry {
	t.Helper()
	es, err := redisdlq.NewStore(s.c, s.key.Stream).List(t.Context(), dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return es
}

type fakeStore struct {
	*relaytest.StateStore
	key invocation.Key
	dlq *relaytest.DLQ
}

func (s fakeStore) get(*testing.T) map[string]string { return s.Get(s.key) }

func (s fakeStore) deadLetters(t *testing.T) []dlq.Entry {
	t.Helper()
	es, err := s.dlq.List(t.Context(), dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// errKind names the contract error err carries, or says whether it is nil.
func errKind(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, invocation.ErrStale):
		return "stale"
	case errors.Is(err, invocation.ErrTerminal):
		return "terminal"
	}
	return "other"
}
