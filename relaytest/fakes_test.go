package relaytest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/manual"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
)

// settableClock is a Clock a test can also move backwards.
type settableClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *settableClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *settableClock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.now = t }

func TestStreamIDsIncreaseWhateverTheClock(t *testing.T) {
	clock := &settableClock{now: time.UnixMilli(5000)}
	s := relaytest.NewStream(relaytest.WithClock(clock))
	pub := func() string {
		t.Helper()
		id, err := s.Publish(t.Context(), map[string]string{"k": "v"})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	var got []string
	got = append(got, pub(), pub()) // the clock stands still
	clock.Set(time.UnixMilli(4000)) // and goes back
	got = append(got, pub())
	clock.Set(time.UnixMilli(6000))
	got = append(got, pub())
	if want := []string{"5000-0", "5000-1", "5000-2", "6000-0"}; !slices.Equal(got, want) {
		t.Errorf("ids = %v, want %v (as XADD * assigns them)", got, want)
	}
}

func TestStreamInspection(t *testing.T) {
	ctx := t.Context()
	clock := relaytest.NewManualClock(start)
	s := relaytest.NewStream(relaytest.WithClock(clock), relaytest.WithBlock(time.Millisecond))
	c1, c2 := s.Consumer("c1"), s.Consumer("c2")
	var ids []string
	for i := range 3 {
		id, err := c1.Publish(ctx, map[string]string{"n": fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if s.Lag() != 3 || s.Len() != 3 || len(s.Pending()) != 0 {
		t.Fatalf("after publishing: lag %d, len %d, pending %v; want 3, 3, none", s.Lag(), s.Len(), s.Pending())
	}
	if _, err := c1.Read(ctx, 2); err != nil {
		t.Fatal(err)
	}
	clock.Advance(1500 * time.Millisecond)
	if _, err := c2.Read(ctx, 2); err != nil {
		t.Fatal(err)
	}
	want := []relaytest.PendingEntry{
		{ID: ids[0], Consumer: "c1", Deliveries: 1, Idle: 1500 * time.Millisecond},
		{ID: ids[1], Consumer: "c1", Deliveries: 1, Idle: 1500 * time.Millisecond},
		{ID: ids[2], Consumer: "c2", Deliveries: 1, Idle: 0},
	}
	if diff := cmp.Diff(want, s.Pending()); diff != "" {
		t.Errorf("Pending (-want +got):\n%s", diff)
	}
	if s.Lag() != 0 || !s.IsPending(ids[0]) || s.IsPending("9-9") || s.IsPending("bad") {
		t.Errorf("lag %d, IsPending(%s) %v, want 0, true, and false for unknown ids", s.Lag(), ids[0], s.IsPending(ids[0]))
	}
	if n := s.Delete(ids[1], "9-9", "bad"); n != 1 || s.Len() != 2 {
		t.Errorf("Delete = %d, Len = %d; want 1 deleted, 2 left", n, s.Len())
	}
	// An ill-formed id fails the whole Ack, as XACK does.
	if err := c1.Ack(ctx, ids[0], "bad"); err == nil {
		t.Error("Ack of an ill-formed id succeeded")
	}
	if !s.IsPending(ids[0]) {
		t.Error("a failed Ack acknowledged an entry")
	}
	n, age, err := c1.Pending(ctx)
	if err != nil || n != 3 || age != 1500*time.Millisecond {
		t.Errorf("Pending = %d, %s, %v; want 3 entries, the oldest 1.5s old", n, age, err)
	}
}

func TestStreamReadBlocksUntilPublish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := relaytest.NewStream(relaytest.WithBlock(time.Hour))
		c := s.Consumer("c")
		got := make(chan []string)
		go func() {
			msgs, err := c.Read(t.Context(), 10)
			if err != nil {
				t.Error(err)
			}
			var ids []string
			for _, m := range msgs {
				ids = append(ids, m.ID)
			}
			got <- ids
		}()
		synctest.Wait() // the reader is blocked
		id, err := s.Publish(t.Context(), map[string]string{"k": "v"})
		if err != nil {
			t.Fatal(err)
		}
		if ids := <-got; !slices.Equal(ids, []string{id}) {
			t.Errorf("blocked Read = %v, want %s", ids, id)
		}

		// Nothing new: Read returns (nil, nil) after the block duration.
		t0 := time.Now()
		msgs, err := c.Read(t.Context(), 10)
		if msgs != nil || err != nil || time.Since(t0) != time.Hour {
			t.Errorf("Read of nothing = %v, %v after %s; want nil, nil after 1h", msgs, err, time.Since(t0))
		}
		// A cancelled context ends a blocked Read with its error.
		ctx, cancel := context.WithCancel(t.Context())
		go func() { synctest.Wait(); cancel() }()
		if _, err := c.Read(ctx, 10); !errors.Is(err, context.Canceled) {
			t.Errorf("Read with a cancelled context: %v, want context.Canceled", err)
		}
	})
}

// TestStreamSetID: a rewound group delivers the entries after the id
// again, acknowledged ones included, as XGROUP SETID then XREADGROUP do.
func TestStreamSetID(t *testing.T) {
	ctx := t.Context()
	clock := relaytest.NewManualClock(start)
	s := relaytest.NewStream(relaytest.WithClock(clock), relaytest.WithBlock(time.Millisecond))
	c1, c2 := s.Consumer("c1"), s.Consumer("c2")
	var ids []string
	for i := range 3 {
		id, err := s.Publish(ctx, map[string]string{"n": fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, err := c1.Read(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := c1.Ack(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if err := s.SetID(ids[0]); err != nil {
		t.Fatal(err)
	}
	msgs, err := c2.Read(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{msgs[0].ID, msgs[1].ID}; len(msgs) != 2 || !slices.Equal(got, ids[1:]) {
		t.Fatalf("Read after SetID(%s) = %+v, want %v", ids[0], msgs, ids[1:])
	}
	if err := s.SetID("0-0"); err != nil {
		t.Fatal(err)
	}
	if msgs, err := c2.Read(ctx, 1); err != nil || len(msgs) != 1 || msgs[0].ID != ids[0] || msgs[0].Deliveries != 1 {
		t.Fatalf("Read after SetID(0-0) = %+v, %v; want the acknowledged %s again, delivery 1", msgs, err, ids[0])
	}
	want := []relaytest.PendingEntry{
		{ID: ids[0], Consumer: "c2", Deliveries: 1},
		{ID: ids[1], Consumer: "c2", Deliveries: 1},
		{ID: ids[2], Consumer: "c2", Deliveries: 1},
	}
	if diff := cmp.Diff(want, s.Pending()); diff != "" {
		t.Errorf("Pending after the rewound reads (-want +got):\n%s", diff)
	}
	if err := s.SetID("bad"); err == nil {
		t.Error("SetID of an ill-formed id succeeded")
	}
}

// TestStateStoreWireForm checks that Get shows the values redisstate.Store
// writes, so assertions on state read the same with the fake and Redis.
func TestStateStoreWireForm(t *testing.T) {
	ctx := t.Context()
	clock := relaytest.NewManualClock(time.UnixMilli(1_000_000))
	var n int
	var mu sync.Mutex
	tokens := func() string { mu.Lock(); defer mu.Unlock(); n++; return fmt.Sprintf("t%d", n) }
	s := relaytest.NewStateStore(relaytest.WithClock(clock), relaytest.WithTokenSource(tokens),
		relaytest.WithDLQ(relaytest.NewDLQ("events", relaytest.WithClock(clock))))
	key := invocation.Key{Stream: "events", Group: "g", MessageID: "1-0"}
	claim := func(field string) invocation.Lease {
		t.Helper()
		r := s.Claim(ctx, []invocation.ClaimRequest{{Key: key, Field: field, Lease: time.Minute, MaxAttempts: 2}})[0]
		if r.Err != nil || r.Status != invocation.Claimed {
			t.Fatalf("claim %s = %+v, %v", field, r.Claim, r.Err)
		}
		return r.Lease
	}
	settle := func(st invocation.Settlement) []invocation.TransitionResult {
		t.Helper()
		st.Key = key
		r := s.Settle(ctx, []invocation.Settlement{st})[0]
		if r.Err != nil {
			t.Fatalf("settle: %v", r.Err)
		}
		return r.Transitions
	}
	check := func(want map[string]string) {
		t.Helper()
		if diff := cmp.Diff(want, s.Get(key)); diff != "" {
			t.Errorf("Get (-want +got):\n%s", diff)
		}
	}
	check(map[string]string{})
	a, b := claim("a/h"), claim("b/h")
	check(map[string]string{"a/h": "running:1060000:1:t1", "b/h": "running:1060000:1:t2"})
	a.Trace = "tr-1"
	res := settle(invocation.Settlement{Transitions: []invocation.Transition{
		{Kind: invocation.Retry, Lease: a, Backoff: 30 * time.Second}, {Kind: invocation.Finish, Lease: b},
	}})
	if want := time.UnixMilli(1_030_000); !res[0].Next.Equal(want) {
		t.Errorf("retry's next attempt = %v, want %v", res[0].Next, want)
	}
	if _, err := s.Pin(ctx, key, "__schedule", `{"handler":"h"}`); err != nil {
		t.Fatal(err)
	}
	check(map[string]string{"a/h": "next_attempt_at:1030000:1:t1", "__trace:a/h": "tr-1", "b/h": "ok", "__schedule": `{"handler":"h"}`})
	clock.Advance(30 * time.Second)
	a = claim("a/h")
	e := dlq.Entry{OriginalID: key.MessageID, Group: "g", Consumer: "c", Reason: "r", App: "a", Handler: "h", HandlerAttempts: 2}
	res = settle(invocation.Settlement{Transitions: []invocation.Transition{{Kind: invocation.Exhaust, Lease: a, Entry: &e}}, Ack: true, Retention: time.Hour})
	if res[0].DLQID != "1030000-0" {
		t.Errorf("exhaust's entry id = %q, want 1030000-0 (the DLQ's clock)", res[0].DLQID)
	}
	check(map[string]string{"a/h": "exhausted:2:t3:dlq", "__dlq:a/h": "1030000-0", "__trace:a/h": "tr-1", "b/h": "ok", "__schedule": `{"handler":"h"}`, "__terminal": "1"})
	clock.Advance(time.Minute)
	if ttl, ok := s.TTL(key); !ok || ttl != 59*time.Minute {
		t.Errorf("TTL = %s, %v; want 59m", ttl, ok)
	}
	clock.Advance(59*time.Minute + time.Millisecond)
	check(map[string]string{})
	if _, ok := s.TTL(key); ok {
		t.Error("TTL of an expired hash reported")
	}
}

func TestFakesHonourCancelledContexts(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	key := invocation.Key{Stream: "s", Group: "g", MessageID: "1-0"}
	d := relaytest.NewDLQ("s")
	st := relaytest.NewStateStore(relaytest.WithDLQ(d))
	if r := st.Claim(ctx, []invocation.ClaimRequest{{Key: key, Field: "a/h", Lease: time.Minute, MaxAttempts: 1}}); !errors.Is(r[0].Err, context.Canceled) {
		t.Errorf("Claim: %v, want context.Canceled", r[0].Err)
	}
	if got := st.Get(key); len(got) != 0 {
		t.Errorf("a cancelled Claim wrote %v", got)
	}
	c := st.Claim(t.Context(), []invocation.ClaimRequest{{Key: key, Field: "a/h", Lease: time.Minute, MaxAttempts: 1}})[0]
	e := dlq.Entry{OriginalID: "1-0", Group: "g", Consumer: "c", Reason: "r", App: "a", Handler: "h", HandlerAttempts: 1}
	exhaust := invocation.Settlement{Key: key, Transitions: []invocation.Transition{{Kind: invocation.Exhaust, Lease: c.Lease, Entry: &e}}, Ack: true}
	if r := st.Settle(ctx, []invocation.Settlement{exhaust}); !errors.Is(r[0].Err, context.Canceled) {
		t.Errorf("Settle: %v, want context.Canceled", r[0].Err)
	}
	if got := st.Get(key); !strings.HasPrefix(got["a/h"], "running:") {
		t.Errorf("a cancelled Settle changed the state: %v", got)
	}
	s := relaytest.NewStream()
	if _, err := s.Publish(ctx, map[string]string{"k": "v"}); !errors.Is(err, context.Canceled) || s.Len() != 0 {
		t.Errorf("Publish: %v with %d entries, want context.Canceled and none", err, s.Len())
	}
	if _, err := d.Write(ctx, e); !errors.Is(err, context.Canceled) {
		t.Errorf("Write: %v, want context.Canceled", err)
	}
	if n, _ := d.Len(t.Context()); n != 0 {
		t.Errorf("cancelled calls wrote %d entries", n)
	}
}

// TestStateStoreDeadLettersFencedByThePEL: a StateStore WithStream writes
// a dead-letter entry only while its message is pending, in the step of
// its marker, as redisstate.Store's Settle does: for a message
// acknowledged, never delivered or never added the settlement is
// ErrTerminal and writes nothing, and once the entry is written and the
// message acknowledged a stale delivery's second Exhaust writes none.
func TestStateStoreDeadLettersFencedByThePEL(t *testing.T) {
	ctx := t.Context()
	src := relaytest.NewStream()
	c := src.Consumer("c")
	d := relaytest.NewDLQ("events")
	store := relaytest.NewStateStore(relaytest.WithStream(src), relaytest.WithDLQ(d))
	publish := func() string {
		t.Helper()
		id, err := src.Publish(ctx, map[string]string{"event": "{}"})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	key := func(id string) invocation.Key { return invocation.Key{Stream: "events", Group: "g", MessageID: id} }
	claim := func(id string) invocation.Claim {
		t.Helper()
		r := store.Claim(ctx, []invocation.ClaimRequest{{Key: key(id), Field: "a/h", Lease: time.Minute, MaxAttempts: 1}})[0]
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		return r.Claim
	}
	exhaust := func(l invocation.Lease) invocation.SettleResult {
		t.Helper()
		e := dlq.Entry{OriginalID: l.Key.MessageID, Group: "g", Consumer: "c", Reason: "r", App: "a", Handler: "h", HandlerAttempts: 1}
		return store.Settle(ctx, []invocation.Settlement{{Key: l.Key, Transitions: []invocation.Transition{{Kind: invocation.Exhaust, Lease: l, Entry: &e}}}})[0]
	}
	acked, pending := publish(), publish()
	if _, err := c.Read(ctx, 10); err != nil {
		t.Fatal(err)
	}
	ackedLease := claim(acked).Lease
	if err := c.Ack(ctx, acked); err != nil {
		t.Fatal(err)
	}
	undelivered := publish()
	for name, l := range map[string]invocation.Lease{
		"acknowledged":    ackedLease,
		"never delivered": {Key: key(undelivered), Field: "a/h", Attempt: 1, Token: "t"},
		"never added":     {Key: key("1-1"), Field: "a/h", Attempt: 1, Token: "t"},
	} {
		if got := claim(l.Key.MessageID); got.Status != invocation.Terminal {
			t.Errorf("%s: claim = %+v, want terminal", name, got)
		}
		if r := exhaust(l); !errors.Is(r.Err, invocation.ErrTerminal) {
			t.Errorf("%s: exhaust = %+v, want ErrTerminal", name, r)
		}
	}
	if n, err := d.Len(ctx); err != nil || n != 0 {
		t.Fatalf("%d entries after refused settlements (%v), want none", n, err)
	}
	l := claim(pending).Lease
	r := exhaust(l)
	if r.Err != nil || r.Transitions[0].DLQID == "" {
		t.Fatalf("exhaust of a pending message = %+v", r)
	}
	if got := store.Get(key(pending))[invocation.DLQField("a/h")]; got != r.Transitions[0].DLQID {
		t.Errorf("%s = %q, want %q", invocation.DLQField("a/h"), got, r.Transitions[0].DLQID)
	}
	if r := store.Settle(ctx, []invocation.Settlement{{Key: key(pending), Ack: true, Retention: time.Hour}})[0]; r.Err != nil || src.IsPending(pending) {
		t.Fatalf("ack = %+v, pending %v; want acknowledged", r, src.IsPending(pending))
	}
	if again := exhaust(l); !errors.Is(again.Err, invocation.ErrTerminal) {
		t.Errorf("exhaust after the ack = %+v, want ErrTerminal", again)
	}
	if n, err := d.Len(ctx); err != nil || n != 1 {
		t.Errorf("%d entries (%v), want 1", n, err)
	}
}

// TestStateStoreDeadLettersOfItsStream: an entry without OriginalStream is
// of the settlement's stream, as redisstate.Store fills it; a message of
// another stream than the DLQ's gets none written, with a *dlq.FieldError.
func TestStateStoreDeadLettersOfItsStream(t *testing.T) {
	ctx := t.Context()
	d := relaytest.NewDLQ("events")
	store := relaytest.NewStateStore(relaytest.WithDLQ(d))
	for _, c := range []struct {
		stream  string
		wantErr bool
	}{{"events", false}, {"other", true}} {
		key := invocation.Key{Stream: c.stream, Group: "g", MessageID: "1-0"}
		l := store.Claim(ctx, []invocation.ClaimRequest{{Key: key, Field: "a/h", Lease: time.Minute, MaxAttempts: 1}})[0].Lease
		e := dlq.Entry{OriginalID: "1-0", Group: "g", Consumer: "c", Reason: "r", App: "a", Handler: "h", HandlerAttempts: 1}
		r := store.Settle(ctx, []invocation.Settlement{{Key: key, Transitions: []invocation.Transition{{Kind: invocation.Exhaust, Lease: l, Entry: &e}}}})[0]
		var fe *dlq.FieldError
		if got := errors.As(r.Err, &fe) && fe.Field == "original_stream"; got != c.wantErr || (!c.wantErr && r.Err != nil) {
			t.Errorf("exhaust of a message of %s: %v, want an original_stream error %v", c.stream, r.Err, c.wantErr)
		}
	}
	entries, err := d.List(ctx, dlq.Filter{})
	if err != nil || len(entries) != 1 || entries[0].OriginalStream != "events" {
		t.Errorf("entries = %+v, %v; want one of events", entries, err)
	}
}

func TestDLQReading(t *testing.T) {
	ctx := t.Context()
	clock := relaytest.NewManualClock(time.UnixMilli(10_000))
	d := relaytest.NewDLQ("events", relaytest.WithClock(clock))
	msg := 0
	write := func(app, handler string) string {
		t.Helper()
		msg++
		id, err := d.Write(ctx, dlq.Entry{OriginalID: fmt.Sprintf("1-%d", msg), Group: "g", Consumer: "c", Reason: "r", App: app, Handler: handler, HandlerAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Second)
		return id
	}
	ids := []string{write("billing", "charge"), write("users", "welcome"), write("billing", "refund"), write("billing", "charge")}
	if want := []string{"10000-0", "11000-0", "12000-0", "13000-0"}; !slices.Equal(ids, want) {
		t.Fatalf("ids = %v, want %v", ids, want)
	}
	list := func(f dlq.Filter) []string {
		t.Helper()
		es, err := d.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range es {
			out = append(out, e.ID)
		}
		return out
	}
	for name, c := range map[string]struct {
		f    dlq.Filter
		want []string
	}{
		"all":     {dlq.Filter{}, ids},
		"app":     {dlq.Filter{App: "billing"}, []string{ids[0], ids[2], ids[3]}},
		"handler": {dlq.Filter{App: "billing", Handler: "charge"}, []string{ids[0], ids[3]}},
		"since":   {dlq.Filter{Since: time.UnixMilli(11_000)}, ids[1:]},
		"limit":   {dlq.Filter{App: "billing", Limit: 2}, []string{ids[0], ids[2]}},
	} {
		if got := list(c.f); !slices.Equal(got, c.want) {
			t.Errorf("%s: List = %v, want %v", name, got, c.want)
		}
	}
	if e, err := d.Get(ctx, ids[1]); err != nil || e.App != "users" || e.OriginalStream != "events" || !e.Timestamp.Equal(time.UnixMilli(11_000)) {
		t.Errorf("Get = %+v, %v", e, err)
	}
	if err := d.Delete(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{ids[1], "99-0", "nope"} {
		if _, err := d.Get(ctx, id); !errors.Is(err, dlq.ErrNotFound) {
			t.Errorf("Get(%q): %v, want dlq.ErrNotFound", id, err)
		}
		if err := d.Delete(ctx, id); !errors.Is(err, dlq.ErrNotFound) {
			t.Errorf("Delete(%q): %v, want dlq.ErrNotFound", id, err)
		}
	}
	if n, err := d.Len(ctx); err != nil || n != 3 {
		t.Errorf("Len = %d, %v; want 3", n, err)
	}
	if _, err := d.List(ctx, dlq.Filter{Limit: -1}); err == nil {
		t.Error("List with a negative Limit succeeded")
	}
}

func TestRunnerScripts(t *testing.T) {
	ctx := t.Context()
	r := relaytest.NewRunner()
	r.Script("a/h", relaytest.Fail(3, "boom"), relaytest.TimeOut(), relaytest.Unavailable("image missing"))
	req := runtime.Request{App: "a", Handler: "h", Timeout: time.Second, Event: []byte(`{}`)}
	var errs []error
	for range 4 {
		_, err := r.Run(ctx, req)
		errs = append(errs, err)
	}
	var ee *runtime.ExitError
	if !errors.As(errs[0], &ee) || ee.Code != 3 || ee.Stderr != "boom" {
		t.Errorf("run 1: %v, want exit code 3", errs[0])
	}
	if !errors.As(errs[1], &ee) || !ee.TimedOut || ee.Timeout != time.Second {
		t.Errorf("run 2: %v, want a timeout after 1s", errs[1])
	}
	if !errors.Is(errs[2], runtime.ErrUnavailable) || errors.As(errs[2], &ee) {
		t.Errorf("run 3: %v, want runtime.ErrUnavailable and no ExitError", errs[2])
	}
	if errs[3] != nil {
		t.Errorf("run 4: %v, want success once the script is used up", errs[3])
	}
	if _, err := r.Run(ctx, runtime.Request{App: "b", Handler: "h"}); err != nil {
		t.Errorf("unscripted handler: %v, want success", err)
	}
	if n, all := len(r.Requests("a/h")), len(r.Requests("")); n != 4 || all != 5 {
		t.Errorf("Requests = %d of a/h, %d in all; want 4 and 5", n, all)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := r.WaitRuns(wctx, "a/h", 5); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitRuns for a run that never comes: %v, want the context's error", err)
	}
}

func TestRunnerBlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := relaytest.NewRunner()
		release := make(chan struct{})
		r.Script("a/h", relaytest.Block(release, relaytest.Fail(1, "")), relaytest.Block(release, relaytest.Succeed()))
		req := runtime.Request{App: "a", Handler: "h"}
		done := make(chan error)
		go func() { _, err := r.Run(t.Context(), req); done <- err }()
		if _, err := r.WaitRuns(t.Context(), "a/h", 1); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("Run returned %v before release", err)
		default:
		}
		close(release)
		var ee *runtime.ExitError
		if err := <-done; !errors.As(err, &ee) {
			t.Errorf("released run: %v, want the scripted failure", err)
		}
		// Abandoned at shutdown: an infrastructure error, no ExitError.
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		block := relaytest.Block(make(chan struct{}), relaytest.Succeed())
		if err := block(ctx, req); !errors.Is(err, context.Canceled) || errors.As(err, &ee) {
			t.Errorf("cancelled block: %v, want context.Canceled and no ExitError", err)
		}
	})
}

func TestOptionMisuse(t *testing.T) {
	for name, f := range map[string]func(){
		"option of another fake": func() { relaytest.NewDLQ("s", relaytest.WithBlock(time.Second)) },
		"token source on stream": func() { relaytest.NewStream(relaytest.WithTokenSource(func() string { return "t" })) },
		"nil clock":              func() { relaytest.NewStateStore(relaytest.WithClock(nil)) },
		"given twice":            func() { relaytest.NewStream(relaytest.WithBlock(time.Second), relaytest.WithBlock(time.Second)) },
		"block below 1ms":        func() { relaytest.NewStream(relaytest.WithBlock(0)) },
		"empty consumer":         func() { relaytest.NewStream().Consumer("") },
		"empty DLQ stream":       func() { relaytest.NewDLQ("") },
		"stream and pending": func() {
			relaytest.NewStateStore(relaytest.WithStream(relaytest.NewStream()), relaytest.WithPending(func(invocation.Key) bool { return true }))
		},
		"DLQ option on a DLQ": func() { relaytest.NewDLQ("s", relaytest.WithDLQ(relaytest.NewDLQ("s"))) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// The fake DLQ serves manual.Invoker.Replay, so replay paths test without Redis.
var _ manual.DLQReader = (*relaytest.DLQ)(nil)
