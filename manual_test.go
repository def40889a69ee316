package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
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
	a := loadOne(t, "shop", shopApp)
	runner, reqs := recorder(t, map[string]runtime.HandlerFunc{
		"orders.audit":  func(context.Context, runtime.Request) error { return errors.New("audit log full") },
		"orders.charge": nil,
		"refunds.run":   nil,
	})
	event := []byte(`{"kind":"order","id":7}`)
	res, err := relay.Manual{Runner: runner}.Invoke(t.Context(), a, event)
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
	want := []runtime.Request{
		{App: "shop", Handler: "orders.audit", Attempt: 1, Event: event, Timeout: 3 * time.Second, Spec: a.Spec},
		{App: "shop", Handler: "orders.charge", Attempt: 1, Event: event, Timeout: 7 * time.Second, Spec: a.Spec},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestInvokeNoMatch(t *testing.T) {
	a := loadOne(t, "shop", shopApp)
	runner, reqs := recorder(t, map[string]runtime.HandlerFunc{"orders.audit": nil})
	res, err := relay.Manual{Runner: runner}.Invoke(t.Context(), a, []byte(`{"kind":"nothing"}`))
	if err != nil || len(res) != 0 || len(*reqs) != 0 {
		t.Errorf("Invoke = %v, %v after %d runs; want nothing", res, err, len(*reqs))
	}
}

func TestInvokeRefuses(t *testing.T) {
	a := loadOne(t, "shop", shopApp)
	broken := loadOne(t, "broken", "image: x\nbogus: 1\nevents:\n  - {handler: a.b, pattern: {kind: [order]}}\n")
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
		{"unavailable app", broken, `{"kind":"order"}`, relay.ErrAppUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := relay.Manual{Runner: runner}.Invoke(t.Context(), tc.app, []byte(tc.event))
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
	a := loadOne(t, "shop", shopApp)
	ctx, cancel := context.WithCancel(t.Context())
	runner, reqs := recorder(t, map[string]runtime.HandlerFunc{
		"orders.audit":  func(context.Context, runtime.Request) error { cancel(); return nil },
		"orders.charge": nil,
	})
	res, err := relay.Manual{Runner: runner}.Invoke(ctx, a, []byte(`{"kind":"order"}`))
	if !errors.Is(err, context.Canceled) || len(res) != 1 || res[0].Err != nil || len(*reqs) != 1 {
		t.Errorf("Invoke = %+v, %v after %d runs; want the first result and context.Canceled", res, err, len(*reqs))
	}
}
