package manual_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/manual"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule"
	"github.com/relaydev/relay/stream"
)

// shopApp has three rules, two of which match kind "order".
const shopApp = `
image: relay.local/busybox:latest
env:
  TOKEN: secret
events:
  - handler: orders.audit
    pattern: {kind: [order]}
    timeout: 3s
  - handler: refunds.run
    pattern: {kind: [refund]}
  - handler: orders.charge
    pattern: {kind: [order]}
    timeout: 7s
    retries: 9
`

// recorder is a Func runner that records every request, in order.
func recorder(t *testing.T, handlers map[string]runtime.HandlerFunc) (relay.Runner, *[]runtime.Request) {
	t.Helper()
	var reqs []runtime.Request
	wrapped := map[string]runtime.HandlerFunc{}
	for k, fn := range handlers {
		wrapped[k] = func(ctx context.Context, req runtime.Request) error {
			reqs = append(reqs, req)
			if fn == nil {
				return nil
			}
			return fn(ctx, req)
		}
	}
	return runtime.NewFunc(wrapped), &reqs
}

func TestInvokeRunsMatchingRulesInDeclarationOrder(t *testing.T) {
	a := apptest.One(t, "shop", shopApp)
	runner, reqs := recorder(t, map[string]runtime.HandlerFunc{
		"orders.audit":  func(context.Context, runtime.Request) error { return errors.New("audit log full") },
		"orders.charge": nil,
		"refunds.run":   nil,
	})
	event := []byte(`{"kind":"order","id":7}`)
	res, err := manual.Invoker{Runner: runner}.Invoke(t.Context(), a, event)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].Handler != "orders.audit" || res[1].Handler != "orders.charge" {
		t.Fatalf("results = %+v; want orders.audit then orders.charge", res)
	}
	// The first failed; the second still ran and succeeded.
	if exit, ok := errors.AsType[*runtime.ExitError](res[0].Err); !ok || !res[0].Failed() || exit.Code != 1 {
		t.Errorf("orders.audit result = %v; want an ExitError", res[0].Err)
	}
	if res[1].Err != nil || res[1].Failed() || res[1].App != "shop" || res[1].Duration <= 0 {
		t.Errorf("orders.charge result = %+v", res[1])
	}
	got := *reqs
	if len(got) != 2 {
		t.Fatalf("ran %d handlers, want 2", len(got))
	}
	// Both rules get one generated message id, which no stream entry id
	// can be.
	id := got[0].MessageID
	if !invokeIDRE.MatchString(id) || stream.IsID(id) {
		t.Errorf("RELAY_MESSAGE_ID of a manual invocation = %q, want invoke- and 16 hex digits", id)
	}
	want := []runtime.Request{
		{App: "shop", Handler: "orders.audit", MessageID: id, Attempt: 1, Event: event, Timeout: 3 * time.Second, Spec: a.Spec},
		{App: "shop", Handler: "orders.charge", MessageID: id, Attempt: 1, Event: event, Timeout: 7 * time.Second, Spec: a.Spec},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	if res[0].MessageID != id || res[1].MessageID != id {
		t.Errorf("results carry message ids %q and %q, want %q", res[0].MessageID, res[1].MessageID, id)
	}
}

// invokeIDRE is the form of a generated manual invocation's message id.
var invokeIDRE = regexp.MustCompile(`^invoke-[0-9a-f]{16}$`)

// TestInvokeMessageID: each Invoke call generates its own message id, and
// Manual.MessageID, when set, is the id the handlers get instead.
func TestInvokeMessageID(t *testing.T) {
	a := apptest.One(t, "shop", shopApp)
	runner, reqs := recorder(t, map[string]runtime.HandlerFunc{"refunds.run": nil})
	event := []byte(`{"kind":"refund"}`)
	for range 2 {
		if _, err := (manual.Invoker{Runner: runner}).Invoke(t.Context(), a, event); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := (manual.Invoker{Runner: runner, MessageID: "1700000000000-5"}).Invoke(t.Context(), a, event); err != nil {
		t.Fatal(err)
	}
	got := *reqs
	if len(got) != 3 || got[0].MessageID == got[1].MessageID || !invokeIDRE.MatchString(got[1].MessageID) || got[2].MessageID != "1700000000000-5" {
		var ids []string
		for _, r := range got {
			ids = append(ids, r.MessageID)
		}
		t.Errorf("message ids %q; want two distinct generated ones, then the one set", ids)
	}
}

func TestInvokeNoMatch(t *testing.T) {
	a := apptest.One(t, "shop", shopApp)
	runner, reqs := recorder(t, map[string]runtime.HandlerFunc{"orders.audit": nil})
	res, err := manual.Invoker{Runner: runner}.Invoke(t.Context(), a, []byte(`{"kind":"nothing"}`))
	if err != nil || len(res) != 0 || len(*reqs) != 0 {
		t.Errorf("Invoke = %v, %v after %d runs; want nothing", res, err, len(*reqs))
	}
}

func TestInvokeRefuses(t *testing.T) {
	a := apptest.One(t, "shop", shopApp)
	broken := apptest.One(t, "broken", "image: x\nbogus: 1\nevents:\n  - {handler: a.b, pattern: {kind: [order]}}\n")
	if broken.Available() || len(broken.Rules) != 1 {
		t.Fatalf("broken app: available %v, %d rules", broken.Available(), len(broken.Rules))
	}
	runner, reqs := recorder(t, map[string]runtime.HandlerFunc{"orders.audit": nil, "orders.charge": nil, "a.b": nil})
	for _, tc := range []struct {
		name  string
		app   *app.App
		event string
		want  error
	}{
		{"array", a, `[{"kind":"order"}]`, matcher.ErrMalformed},
		{"string", a, `"order"`, matcher.ErrMalformed},
		{"not json", a, `{kind: order}`, matcher.ErrMalformed},
		{"empty", a, ``, matcher.ErrMalformed},
		{"unavailable app", broken, `{"kind":"order"}`, manual.ErrAppUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := manual.Invoker{Runner: runner}.Invoke(t.Context(), tc.app, []byte(tc.event))
			if !errors.Is(err, tc.want) || res != nil {
				t.Errorf("Invoke = %v, %v; want %v", res, err, tc.want)
			}
		})
	}
	if len(*reqs) != 0 {
		t.Errorf("%d handlers ran", len(*reqs))
	}
}

func TestInvokeStopsWhenCancelled(t *testing.T) {
	a := apptest.One(t, "shop", shopApp)
	ctx, cancel := context.WithCancel(t.Context())
	runner, reqs := recorder(t, map[string]runtime.HandlerFunc{
		"orders.audit":  func(context.Context, runtime.Request) error { cancel(); return nil },
		"orders.charge": nil,
	})
	res, err := manual.Invoker{Runner: runner}.Invoke(ctx, a, []byte(`{"kind":"order"}`))
	if !errors.Is(err, context.Canceled) || len(res) != 1 || res[0].Err != nil || len(*reqs) != 1 {
		t.Errorf("Invoke = %+v, %v after %d runs; want the first result and context.Canceled", res, err, len(*reqs))
	}
}

// replayFixture is a DLQ on the shared redis-server and the apps its
// entries refer to.
type replayFixture struct {
	seq   int
	t     *testing.T
	store *redisdlq.Store
	apps  *app.Set
}

func newReplayFixture(t *testing.T) *replayFixture {
	t.Helper()
	return &replayFixture{
		t:     t,
		store: redisdlq.NewStore(redistest.Client(t), redistest.Name(t, "events")),
		apps: apptest.Load(t, map[string]string{
			"shop":   shopApp,
			"broken": "image: x\nbogus: 1\nevents:\n  - {handler: a.b, pattern: {kind: [order]}}\n",
		}),
	}
}

// write adds an entry for app/handler (both "-" for a malformed message).
func (f *replayFixture) write(app, handler string) dlq.Entry {
	f.t.Helper()
	f.seq++ // a message of its own: DLQ writes are idempotent per invocation
	e := dlq.Entry{
		OriginalID: fmt.Sprintf("1700000000000-%d", f.seq), Group: "workers", Consumer: "c1",
		Event: `{"kind":"order","id":7}`, Reason: "handler exited with code 3",
		App: app, Handler: handler, Deliveries: 4, HandlerAttempts: 3,
	}
	if app == dlq.MalformedName {
		e.HandlerAttempts, e.Event, e.Reason = 0, `[1]`, "malformed event: want a JSON object, got an array"
	}
	id, err := f.store.Write(f.t.Context(), e)
	if err != nil {
		f.t.Fatal(err)
	}
	e.ID = id
	return e
}

func (f *replayFixture) exists(id string) bool {
	f.t.Helper()
	_, err := f.store.Get(context.Background(), id)
	if err != nil && !errors.Is(err, dlq.ErrNotFound) {
		f.t.Fatal(err)
	}
	return err == nil
}

func TestReplaySuccessDeletesTheEntry(t *testing.T) {
	t.Parallel()
	f := newReplayFixture(t)
	runner, reqs := recorder(t, map[string]runtime.HandlerFunc{"orders.charge": nil})
	e := f.write("shop", "orders.charge")
	other := f.write("shop", "orders.charge")
	if err := (manual.Invoker{Runner: runner}).Replay(t.Context(), f.apps, f.store, e.ID); err != nil {
		t.Fatal(err)
	}
	want := []runtime.Request{{
		App: "shop", Handler: "orders.charge", MessageID: e.OriginalID, Attempt: 4,
		Event: []byte(e.Event), Timeout: 7 * time.Second, Spec: f.apps.Get("shop").Spec,
	}}
	if diff := cmp.Diff(want, *reqs); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	if f.exists(e.ID) {
		t.Error("the replayed entry is still in the DLQ")
	}
	if !f.exists(other.ID) {
		t.Error("another entry was deleted")
	}
	// Replaying it again finds nothing and runs nothing.
	if err := (manual.Invoker{Runner: runner}).Replay(t.Context(), f.apps, f.store, e.ID); !errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("second Replay = %v, want dlq.ErrNotFound", err)
	}
	if len(*reqs) != 1 {
		t.Errorf("ran %d times, want 1", len(*reqs))
	}
}

func TestReplayFailureKeepsTheEntry(t *testing.T) {
	t.Parallel()
	f := newReplayFixture(t)
	e := f.write("shop", "orders.charge")
	for _, tc := range []struct {
		name    string
		handler runtime.HandlerFunc
		exit    bool // the error wraps a *runtime.ExitError
	}{
		{"handler fails", func(context.Context, runtime.Request) error { return errors.New("card declined") }, true},
		{"handler times out", func(ctx context.Context, _ runtime.Request) error { <-ctx.Done(); return ctx.Err() }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := apptest.One(t, "shop", shopApp)
			a.Rules[2].Timeout = 50 * time.Millisecond
			apps, err := app.NewSet(a)
			if err != nil {
				t.Fatal(err)
			}
			runner := runtime.NewFunc(map[string]runtime.HandlerFunc{"orders.charge": tc.handler})
			err = manual.Invoker{Runner: runner}.Replay(t.Context(), apps, f.store, e.ID)
			if _, ok := errors.AsType[*runtime.ExitError](err); ok != tc.exit {
				t.Errorf("Replay = %v; want an ExitError: %v", err, tc.exit)
			}
			if !f.exists(e.ID) {
				t.Fatal("the entry of a failed replay was deleted")
			}
		})
	}
	// An infrastructure failure keeps it too.
	down := runnerFunc(func(context.Context, runtime.Request) (runtime.Result, error) {
		return runtime.Result{}, runtime.ErrUnavailable
	})
	if err := (manual.Invoker{Runner: down}).Replay(t.Context(), f.apps, f.store, e.ID); !errors.Is(err, runtime.ErrUnavailable) || !f.exists(e.ID) {
		t.Errorf("Replay with the runtime down = %v (entry kept: %v)", err, f.exists(e.ID))
	}
}

func TestReplayRefuses(t *testing.T) {
	t.Parallel()
	f := newReplayFixture(t)
	runner, reqs := recorder(t, map[string]runtime.HandlerFunc{"orders.charge": nil, "gone.handler": nil, "a.b": nil})
	for _, tc := range []struct {
		name string
		id   string
		want error
	}{
		{"malformed entry", f.write(dlq.MalformedName, dlq.MalformedName).ID, manual.ErrReplayMalformed},
		{"app gone", f.write("gone", "orders.charge").ID, manual.ErrHandlerGone},
		{"handler gone", f.write("shop", "gone.handler").ID, manual.ErrHandlerGone},
		{"app unavailable", f.write("broken", "a.b").ID, manual.ErrAppUnavailable},
		{"unknown id", "1-1", dlq.ErrNotFound},
		{"not an id", "bogus", dlq.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := manual.Invoker{Runner: runner}.Replay(t.Context(), f.apps, f.store, tc.id)
			if !errors.Is(err, tc.want) {
				t.Errorf("Replay = %v, want %v", err, tc.want)
			}
			if tc.want != dlq.ErrNotFound && !f.exists(tc.id) {
				t.Error("a refused entry was deleted")
			}
		})
	}
	if len(*reqs) != 0 {
		t.Errorf("%d handlers ran", len(*reqs))
	}
}

// A dead-lettered schedule occurrence is replayed with the occurrence's
// stdin, not the envelope, under the schedule's timeout.
func TestReplayScheduleOccurrence(t *testing.T) {
	t.Parallel()
	store := redisdlq.NewStore(redistest.Client(t), redistest.Name(t, "events"))
	apps := apptest.Load(t, map[string]string{"billing": apptest.NightlyApp})
	runner, reqs := recorder(t, map[string]runtime.HandlerFunc{"jobs.nightly": nil})
	env := schedule.NewEnvelope(apptest.NightlySpec(), apptest.NightlyAt)
	write := func(handler string) string {
		id, err := store.Write(t.Context(), dlq.Entry{OriginalID: "1700000000000-9", Group: "workers", Consumer: "c1",
			Event: string(env.Marshal()), Reason: "exit 3", App: "billing", Handler: handler, HandlerAttempts: 2})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	id := write("jobs.nightly")
	if err := (manual.Invoker{Runner: runner}).Replay(t.Context(), apps, store, id); err != nil {
		t.Fatal(err)
	}
	want := []runtime.Request{{
		App: "billing", Handler: "jobs.nightly", MessageID: "1700000000000-9", Attempt: 3,
		Event: env.Input(), Timeout: 5 * time.Second, Spec: apps.Get("billing").Spec,
	}}
	if diff := cmp.Diff(want, *reqs); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	// The schedule no longer names that handler: nothing runs.
	gone := write("jobs.old")
	if err := (manual.Invoker{Runner: runner}).Replay(t.Context(), apps, store, gone); !errors.Is(err, manual.ErrHandlerGone) {
		t.Errorf("replay of a handler the schedule no longer names = %v, want ErrHandlerGone", err)
	}
	if len(*reqs) != 1 {
		t.Errorf("ran %d times, want 1", len(*reqs))
	}
}
