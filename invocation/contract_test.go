package invocation_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/relaytest"
)

// TestStoreContract runs the shared relay.StateStore suite against Store on
// the shared redis-server. Leases, backoffs and TTLs run on the server's
// clock, so the suite's short durations pass for real.
func TestStoreContract(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t)
	var tokens atomic.Uint64 // claim tokens, unique across the sub-tests
	now := func(t *testing.T) time.Time {
		t.Helper()
		parts, err := c.Do(t.Context(), c.B().Time().Build()).AsStrSlice()
		if err != nil || len(parts) != 2 {
			t.Fatalf("TIME: %v, %v", parts, err)
		}
		sec, err1 := strconv.ParseInt(parts[0], 10, 64)
		usec, err2 := strconv.ParseInt(parts[1], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("TIME: %v", parts)
		}
		return time.Unix(sec, usec*1000)
	}
	relaytest.TestStateStore(t, func(t *testing.T) relaytest.StateStoreHarness {
		stream := redistest.Name(t, "stream")
		// A Store of the sub-test's own, whose next claim token ClaimToken
		// may choose.
		var mu sync.Mutex
		var next string
		store := invocation.New(c, invocation.WithTokenSource(func() string {
			mu.Lock()
			defer mu.Unlock()
			if tok := next; tok != "" {
				next = ""
				return tok
			}
			return strconv.FormatUint(tokens.Add(1), 36) + "t"
		}))
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

// TestFakeStoreAgrees replays one sequence of transitions, covering every
// value a field can hold, on Store and on relaytest.StateStore with the
// same claim tokens, and compares every result and the whole hash after
// each step. Deadlines come from different clocks and are compared by
// shape only; the contract suite checks their values.
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
	}
	for _, r := range c.DoMulti(t.Context(),
		c.B().Xadd().Key(key.Stream).Id(key.MessageID).FieldValue().FieldValue("event", "{}").Build(),
		c.B().XgroupCreate().Key(key.Stream).Group(key.Group).Id("0").Build()) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	readAll(t, c, key.Stream)
	var acked atomic.Bool // the fake's PEL: the one message, until the ack step
	realTokens, realClaims := tokens()
	fakeTokens, fakeClaims := tokens()
	real := redisStore{invocation.New(c, invocation.WithTokenSource(realTokens)), key}
	fake := fakeStore{relaytest.NewStateStore(relaytest.WithTokenSource(fakeTokens),
		relaytest.WithPending(func(k invocation.Key) bool { return k == key && !acked.Load() })), key}
	claims.Store(relay.StateStore(real), realClaims)
	claims.Store(relay.StateStore(fake), fakeClaims)
	deadline := regexp.MustCompile(`^(running|next_attempt_at):\d+:`)
	normalize := func(m map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			out[k] = deadline.ReplaceAllString(v, "$1:<ms>:")
		}
		return out
	}
	// A step runs one call on a store and describes its result.
	type step struct {
		name string
		do   func(ctx context.Context, s relay.StateStore, leases map[string]invocation.Lease) string
	}
	claim := func(f string, maxAttempts int) func(context.Context, relay.StateStore, map[string]invocation.Lease) string {
		return func(ctx context.Context, s relay.StateStore, leases map[string]invocation.Lease) string {
			cl, err := s.Claim(ctx, key, f, time.Hour, maxAttempts, invocation.Record{})
			if cl.Status == invocation.Claimed || cl.Status == invocation.Exhausted {
				leases[f] = cl.Lease
			}
			return fmt.Sprintf("%v attempt=%d token=%s prev=%q err=%v", cl.Status, cl.Lease.Attempt, cl.Lease.Token, cl.PrevTrace, errKind(err))
		}
	}
	// lease runs op, a method expression such as relay.StateStore.Finish,
	// with the latest lease of field f carrying trace.
	lease := func(f string, trace string, op func(relay.StateStore, context.Context, invocation.Lease) error) func(context.Context, relay.StateStore, map[string]invocation.Lease) string {
		return func(ctx context.Context, s relay.StateStore, leases map[string]invocation.Lease) string {
			l := leases[f]
			l.Trace = trace
			return "err=" + errKind(op(s, ctx, l))
		}
	}
	retry := func(s relay.StateStore, ctx context.Context, l invocation.Lease) error {
		_, err := s.ScheduleRetry(ctx, l, 0)
		return err
	}
	void := func(s relay.StateStore, ctx context.Context, l invocation.Lease) error {
		return s.(relay.ClaimVoider).Void(ctx, l)
	}
	// voidNext voids the store's next claim of field f before it runs.
	voidNext := func(f string) func(context.Context, relay.StateStore, map[string]invocation.Lease) string {
		return func(ctx context.Context, s relay.StateStore, _ map[string]invocation.Lease) string {
			return "err=" + errKind(void(s, ctx, invocation.Lease{Key: key, Field: f, Token: next(s)}))
		}
	}
	steps := []step{
		{"claim a", claim("a/h", 2)},
		{"claim b", claim("b/h", 3)},
		{"claim a again", claim("a/h", 2)},
		{"retry a with lineage", lease("a/h", "tr-a1", retry)},
		{"finish a, spent lease", lease("a/h", "", relay.StateStore.Finish)},
		{"claim a, attempt 2", claim("a/h", 2)},
		{"release a", lease("a/h", "tr-a2", relay.StateStore.Release)},
		{"claim a, attempt 2 again", claim("a/h", 2)},
		{"exhaust a", lease("a/h", "", relay.StateStore.Exhaust)},
		{"claim a, exhausted", claim("a/h", 2)},
		{"mark a", lease("a/h", "", relay.StateStore.MarkDLQ)},
		{"mark a again", lease("a/h", "", relay.StateStore.MarkDLQ)},
		{"release b", lease("b/h", "tr-b1", relay.StateStore.Release)},
		{"claim b, attempt 1 again", claim("b/h", 3)},
		{"void d before its claim, no state", voidNext("d/h")},
		{"claim d, voided", claim("d/h", 2)},
		{"claim d, attempt 1", claim("d/h", 2)},
		{"void d's claim", lease("d/h", "", void)},
		{"void d's claim again", lease("d/h", "", void)},
		{"void d before its claim, due", voidNext("d/h")},
		{"claim d, voided again", claim("d/h", 2)},
		{"claim d, attempt 1 again", claim("d/h", 2)},
		{"void a lost claim of d beside its lease", voidNext("d/h")},
		{"pin", func(ctx context.Context, s relay.StateStore, _ map[string]invocation.Lease) string {
			v, err := s.Pin(ctx, key, "__schedule", "first")
			w, err2 := s.Pin(ctx, key, "__schedule", "second")
			return fmt.Sprintf("%s %s err=%v %v", v, w, errKind(err), errKind(err2))
		}},
		{"finish b", lease("b/h", "", relay.StateStore.Finish)},
		{"claim b, succeeded", claim("b/h", 3)},
		{"retain while pending", func(ctx context.Context, s relay.StateStore, _ map[string]invocation.Lease) string {
			return "refused=" + strconv.FormatBool(s.Retain(ctx, key, time.Hour) != nil)
		}},
		{"ack", func(ctx context.Context, s relay.StateStore, _ map[string]invocation.Lease) string {
			if s == real {
				return "err=" + errKind(c.Do(ctx, c.B().Xack().Key(key.Stream).Group(key.Group).Id(key.MessageID).Build()).Error())
			}
			acked.Store(true)
			return "err=nil"
		}},
		{"finish b after the ack, terminal", lease("b/h", "", relay.StateStore.Finish)},
		{"retain", func(ctx context.Context, s relay.StateStore, _ map[string]invocation.Lease) string {
			return "err=" + errKind(s.Retain(ctx, key, time.Hour))
		}},
		{"claim c, terminal", claim("c/h", 1)},
		{"exhaust a, terminal", lease("a/h", "", relay.StateStore.Exhaust)},
		{"void d, terminal", lease("d/h", "", void)},
		{"retain 0 deletes", func(ctx context.Context, s relay.StateStore, _ map[string]invocation.Lease) string {
			return "err=" + errKind(s.Retain(ctx, key, 0))
		}},
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
	}
}

type redisStore struct {
	*invocation.Store
	key invocation.Key
}

func (s redisStore) get(t *testing.T) map[string]string {
	t.Helper()
	m, err := s.Get(t.Context(), s.key)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type fakeStore struct {
	*relaytest.StateStore
	key invocation.Key
}

func (s fakeStore) get(*testing.T) map[string]string { return s.Get(s.key) }

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
	return "other: " + err.Error()
}
