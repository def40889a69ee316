package runtime_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/runtime"
)

func TestMiddlewareWrapsEveryHandlerInOrder(t *testing.T) {
	var calls []string
	mw := func(name string) runtime.Middleware {
		return func(next runtime.HandlerFunc) runtime.HandlerFunc {
			return func(ctx context.Context, req runtime.Request) error {
				calls = append(calls, name+">"+req.Handler)
				err := next(ctx, req)
				calls = append(calls, name+"<")
				return err
			}
		}
	}
	f := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"h": func(context.Context, runtime.Request) error { calls = append(calls, "handler"); return nil },
		"p": func(context.Context, runtime.Request) error { panic("boom") },
	}, runtime.WithMiddleware(mw("a"), mw("b")))
	if _, err := f.Run(t.Context(), runtime.Request{App: "x", Handler: "h"}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(calls, " "); got != "a>h b>h handler b< a<" {
		t.Errorf("calls %q, want the first middleware outermost", got)
	}
	// A panic inside the chain still fails the attempt as a panic.
	_, err := f.Run(t.Context(), runtime.Request{App: "x", Handler: "p"})
	var ee *runtime.ExitError
	var pe *runtime.PanicError
	if !errors.As(err, &ee) || ee.Code != 2 || !errors.As(err, &pe) {
		t.Errorf("panicking handler under middleware: %v", err)
	}
}

func TestPermanentFailures(t *testing.T) {
	f := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"never": func(context.Context, runtime.Request) error {
			return runtime.Permanent(errors.New("order 7 does not exist"))
		},
		"again": func(context.Context, runtime.Request) error { return errors.New("database busy") },
	})
	_, err := f.Run(t.Context(), runtime.Request{App: "shop", Handler: "never"})
	var ee *runtime.ExitError
	if !errors.As(err, &ee) || !ee.IsPermanent() || ee.Code != runtime.ExitPermanent || !strings.Contains(err.Error(), "order 7 does not exist") {
		t.Errorf("Permanent error: %v (%+v), want a permanent ExitError with the reason", err, ee)
	}
	_, err = f.Run(t.Context(), runtime.Request{App: "shop", Handler: "again"})
	if !errors.As(err, &ee) || ee.IsPermanent() {
		t.Errorf("ordinary error: %v, want a retryable ExitError", err)
	}
	if runtime.Permanent(nil) != nil {
		t.Error("Permanent(nil) is not nil")
	}
	for _, tc := range []struct {
		ee   runtime.ExitError
		want bool
	}{
		{runtime.ExitError{Code: runtime.ExitPermanent}, true},
		{runtime.ExitError{Code: 1}, false},
		{runtime.ExitError{Code: runtime.ExitPermanent, TimedOut: true}, false},
		{runtime.ExitError{Code: runtime.ExitPermanent, OOMKilled: true}, false},
	} {
		if got := tc.ee.IsPermanent(); got != tc.want {
			t.Errorf("%+v.IsPermanent() = %v, want %v", tc.ee, got, tc.want)
		}
	}
}

func TestTypedHandlers(t *testing.T) {
	type order struct {
		Type   string `json:"type"`
		Amount int    `json:"amount"`
	}
	var got order
	var inv runtime.Invocation
	f := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"orders.charge": runtime.Typed(func(ctx context.Context, o order, i runtime.Invocation) error {
			got, inv = o, i
			if o.Amount > 1000 {
				return errors.New("over the limit")
			}
			return nil
		}),
	})
	req := runtime.Request{App: "shop", Handler: "orders.charge", MessageID: "1-0", Attempt: 2,
		Event: []byte(`{"type":"orders.charge","amount":42,"extra":true}`), Env: map[string]string{"TRACEPARENT": "00-ab-cd-01"}}
	if _, err := f.Run(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if got != (order{"orders.charge", 42}) || inv != (runtime.Invocation{App: "shop", Handler: "orders.charge", MessageID: "1-0", Attempt: 2, Trace: "00-ab-cd-01"}) {
		t.Errorf("got %+v, %+v", got, inv)
	}
	req.Event = []byte(`{"amount":5000}`)
	_, err := f.Run(t.Context(), req)
	var ee *runtime.ExitError
	if !errors.As(err, &ee) || ee.IsPermanent() {
		t.Errorf("handler error: %v, want a retryable failure", err)
	}
	req.Event = []byte(`{"type":"orders.charge","amount":"lots"}`)
	_, err = f.Run(t.Context(), req)
	if !errors.As(err, &ee) || !ee.IsPermanent() || !strings.Contains(err.Error(), "order.amount") {
		t.Errorf("undecodable event: %v, want a permanent failure naming the field", err)
	}
}

func TestCheckHandlers(t *testing.T) {
	ok := func(context.Context, runtime.Request) error { return nil }
	f := runtime.NewFunc(map[string]runtime.HandlerFunc{"shop/orders.placed": ok, "orders.charge": ok, "orders.plaecd": ok})
	err := f.CheckHandlers([]runtime.Target{{App: "shop", Handler: "orders.placed"}, {App: "shop", Handler: "orders.charge"},
		{App: "shop", Handler: "orders.refund"}, {App: "billing", Handler: "orders.charge"},
		{App: "mail", Handler: "mail.send", Spec: runtime.Spec{Runtime: runtime.RuntimePython3}}})
	// mail runs containers: Func may stand in for it, need not.
	if err == nil || !strings.Contains(err.Error(), "no Go function registered for shop/orders.refund;") ||
		!strings.Contains(err.Error(), "registered but named by no rule or schedule: orders.plaecd") {
		t.Errorf("CheckHandlers = %v", err)
	}
	if err := f.CheckHandlers([]runtime.Target{{App: "shop", Handler: "orders.placed"}, {App: "shop", Handler: "orders.charge", Spec: runtime.Spec{Runtime: runtime.RuntimeGo}},
		{App: "x", Handler: "orders.plaecd"}}); err != nil {
		t.Errorf("CheckHandlers of matching rules = %v", err)
	}
	if !f.Handles("any", "orders.charge") || f.Handles("shop", "nope") {
		t.Error("Handles disagrees with the map")
	}
}

// TestHandlerNameCannotReachAnotherApp: a handler name may hold a "/" (a
// module path), but a key with a "/" is always "<app>/<handler>": the
// handler "billing/invoice.pay" of app "evil" is not served by billing's
// function, neither when run nor when the handlers are checked.
func TestHandlerNameCannotReachAnotherApp(t *testing.T) {
	ran := false
	f := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"billing/invoice.pay": func(context.Context, runtime.Request) error { ran = true; return nil },
	})
	_, err := f.Run(t.Context(), runtime.Request{App: "evil", Handler: "billing/invoice.pay", Timeout: time.Second})
	var ee *runtime.ExitError
	if ran || !errors.As(err, &ee) || ee.Code != 127 {
		t.Errorf("evil's handler billing/invoice.pay: ran %v, err %v; want no function (127)", ran, err)
	}
	if f.Handles("evil", "billing/invoice.pay") {
		t.Error("Handles(evil, billing/invoice.pay) = true")
	}
	goSpec := runtime.Spec{Runtime: runtime.RuntimeGo}
	err = f.CheckHandlers([]runtime.Target{{App: "billing", Handler: "invoice.pay", Spec: goSpec}, {App: "evil", Handler: "billing/invoice.pay", Spec: goSpec}})
	var m *runtime.HandlerMismatch
	if !errors.As(err, &m) || strings.Join(m.Missing, ",") != "evil/billing/invoice.pay" {
		t.Errorf("CheckHandlers = %v; want evil/billing/invoice.pay missing", err)
	}
}
