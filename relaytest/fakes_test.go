package relaytest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// TestStateStoreWireForm checks that Get shows the values invocation.Store
// writes, so assertions on state read the same with the fake and Redis.
func TestStateStoreWireForm(t *testing.T) {
	ctx := t.Context()
	clock := relaytest.NewManualClock(time.UnixMilli(1_000_000))
	var n int
	var mu sync.Mutex
	tokens := func() string { mu.Lock(); defer mu.Unlock(); n++; return fmt.Sprintf("t%d", n) }
	s := relaytest.NewStateStore(relaytest.WithClock(clock), relaytest.WithTokenSource(tokens))
	key := invocation.Key{Stream: "events", Group: "g", MessageID: "1-0"}
	claim := func(field string) invocation.Lease {
		t.Helper()
		c, err := s.Claim(ctx, key, field, time.Minute, 2, invocation.Record{})
		if err != nil || c.Status != invocation.Claimed {
			t.Fatalf("claim %s = %+v, %v", field, c, err)
		}
		return c.Lease
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
	if _, err := s.ScheduleRetry(ctx, a, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, b); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pin(ctx, key, "__schedule", `{"handler":"h"}`); err != nil {
		t.Fatal(err)
	}
	check(map[string]string{"a/h": "next_attempt_at:1030000:1:t1", "__trace:a/h": "tr-1", "b/h": "ok", "__schedule": `{"handler":"h"}`})
	clock.Advance(30 * time.Second)
	a = claim("a/h")
	if err := s.Exhaust(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDLQ(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.Retain(ctx, key, time.Hour); err != nil {
		t.Fatal(err)
	}
	check(map[string]string{"a/h": "exhausted:2:t3:dlq", "__trace:a/h": "tr-1", "b/h": "ok", "__schedule": `{"handler":"h"}`, "__terminal": "1"})
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
	st := relaytest.NewStateStore()
	if _, err := st.Claim(ctx, key, "a/h", time.Minute, 1, invocation.Record{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Claim: %v, want context.Canceled", err)
	}
	if got := st.Get(key); len(got) != 0 {
		t.Errorf("a cancelled Claim wrote %v", got)
	}
	s := relaytest.NewStream()
	if _, err := s.Publish(ctx, map[string]string{"k": "v"}); !errors.Is(err, context.Canceled) || s.Len() != 0 {
		t.Errorf("Publish: %v with %d entries, want context.Canceled and none", err, s.Len())
	}
	d := relaytest.NewDLQ("s")
	e := dlq.Entry{OriginalID: "1-0", Group: "g", Consumer: "c", Reason: "r", App: "a", Handler: "h", HandlerAttempts: 1}
	if _, err := d.Write(ctx, e); !errors.Is(err, context.Canceled) {
		t.Errorf("Write: %v, want context.Canceled", err)
	}
}

// TestDLQPELFence: a DLQ WithPending writes an entry only while its
// message is pending, as a dlq.Writer WithPELFence does; refused, it
// returns dlq.ErrNotPending and writes nothing. Once written, a later
// write returns the entry's id wherever the message is.
func TestDLQPELFence(t *testing.T) {
	ctx := t.Context()
	src := relaytest.NewStream()
	c := src.Consumer("c")
	acked, err := src.Publish(ctx, map[string]string{"event": "{}"})
	if err != nil {
		t.Fatal(err)
	}
	pending, _ := src.Publish(ctx, map[string]string{"event": "{}"})
	if _, err := c.Read(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := c.Ack(ctx, acked); err != nil {
		t.Fatal(err)
	}
	undelivered, _ := src.Publish(ctx, map[string]string{"event": "{}"})
	d := relaytest.NewDLQ("events", relaytest.WithPending(func(k invocation.Key) bool { return src.IsPending(k.MessageID) }))
	entry := func(id string) dlq.Entry {
		return dlq.Entry{OriginalID: id, Group: "g", Consumer: "c", Reason: "r", App: "a", Handler: "h", HandlerAttempts: 1}
	}
	for name, id := range map[string]string{"acknowledged": acked, "never delivered": undelivered, "never added": "1-1"} {
		if got, err := d.Write(ctx, entry(id)); !errors.Is(err, dlq.ErrNotPending) || got != "" {
			t.Errorf("%s: Write = %q, %v; want dlq.ErrNotPending", name, got, err)
		}
	}
	if n, err := d.Len(ctx); err != nil || n != 0 {
		t.Fatalf("%d entries after refused writes (%v), want none", n, err)
	}
	id, err := d.Write(ctx, entry(pending))
	if err != nil || id == "" {
		t.Fatalf("Write of a pending message = %q, %v", id, err)
	}
	if err := c.Ack(ctx, pending); err != nil {
		t.Fatal(err)
	}
	if again, err := d.Write(ctx, entry(pending)); err != nil || again != id {
		t.Errorf("Write after the ack = %q, %v; want the entry written while pending, %q", again, err, id)
	}
	if n, err := d.Len(ctx); err != nil || n != 1 {
		t.Errorf("%d entries (%v), want 1", n, err)
	}
}

func TestDLQReading(t *testing.T) {
	ctx := t.Context()
	clock := relaytest.NewManualClock(time.UnixMilli(10_000))
	d := relaytest.NewDLQ("events", relaytest.WithClock(clock))
	msg := 0
	write := func(app, handler string) string {
		t.Helper()
		msg++ // each a message of its own: writes are idempotent per invocation
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
