package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/relaydev/relay/runtime"
)

func TestFunc(t *testing.T) {
	errBoom := errors.New("boom")
	var got runtime.Request
	f := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"users/events.created": func(ctx context.Context, req runtime.Request) error {
			got = req
			return nil
		},
		"events.created": func(context.Context, runtime.Request) error {
			return errors.New("generic handler must not win over the app-specific one")
		},
		"generic.any":  func(context.Context, runtime.Request) error { return nil },
		"billing/fail": func(context.Context, runtime.Request) error { return errBoom },
		"billing/panic": func(context.Context, runtime.Request) error {
			panic("kaboom")
		},
		"billing/slow": func(ctx context.Context, _ runtime.Request) error {
			<-ctx.Done()
			return ctx.Err()
		},
		"billing/slow-ok": func(ctx context.Context, _ runtime.Request) error {
			<-ctx.Done()
			return nil // returned nil, but too late
		},
	})
	run := func(app, handler string, timeout time.Duration) (runtime.Result, error) {
		return f.Run(t.Context(), runtime.Request{App: app, Handler: handler, Event: []byte(`{}`), Timeout: timeout, Attempt: 1})
	}

	t.Run("success", func(t *testing.T) {
		res, err := run("users", "events.created", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got.App != "users" || string(got.Event) != `{}` {
			t.Errorf("handler got %+v", got)
		}
		if res.Duration <= 0 {
			t.Errorf("Duration = %v", res.Duration)
		}
	})
	t.Run("handler-only key", func(t *testing.T) {
		if _, err := run("other", "generic.any", time.Second); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("error", func(t *testing.T) {
		_, err := run("billing", "fail", time.Second)
		ee := asExit(t, err)
		if ee.Code != 1 || ee.TimedOut || !errors.Is(err, errBoom) {
			t.Errorf("got %#v, want code 1 wrapping errBoom", ee)
		}
	})
	t.Run("panic", func(t *testing.T) {
		_, err := run("billing", "panic", time.Second)
		ee := asExit(t, err)
		var pe *runtime.PanicError
		if ee.Code != 2 || !errors.As(err, &pe) || pe.Value != "kaboom" || len(pe.Stack) == 0 {
			t.Errorf("got %#v, want code 2 wrapping a PanicError", ee)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		for _, h := range []string{"slow", "slow-ok"} {
			_, err := run("billing", h, 20*time.Millisecond)
			if ee := asExit(t, err); !ee.TimedOut {
				t.Errorf("%s: got %#v, want TimedOut", h, ee)
			}
		}
	})
	t.Run("unknown handler", func(t *testing.T) {
		_, err := run("billing", "nope.missing", time.Second)
		ee := asExit(t, err)
		if ee.Code != 127 || ee.Err == nil {
			t.Fatalf("got %#v, want code 127", ee)
		}
		if want := `handler failed: no handler "nope.missing" registered for app "billing"`; err.Error() != want {
			t.Errorf("error = %q, want %q", err, want)
		}
	})
	t.Run("shutdown", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := f.Run(ctx, runtime.Request{App: "billing", Handler: "slow", Timeout: time.Minute})
		var ee *runtime.ExitError
		if errors.As(err, &ee) || !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want an infrastructure error wrapping context.Canceled", err)
		}
	})
}

func asExit(t *testing.T, err error) *runtime.ExitError {
	t.Helper()
	ee, ok := errors.AsType[*runtime.ExitError](err)
	if !ok {
		t.Fatalf("error %v (%T) is not an *ExitError", err, err)
	}
	return ee
}

// TestNewFuncRefusesANilFunction: a nil function under a key is a
// programming error, named at once rather than found at the first event,
// or reported by CheckHandlers as both missing and registered.
func TestNewFuncRefusesANilFunction(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), `"shop/orders.charge"`) {
			t.Errorf("NewFunc with a nil function: recovered %v, want a panic naming the key", r)
		}
	}()
	runtime.NewFunc(map[string]runtime.HandlerFunc{"shop/orders.charge": nil, "shop/refunds.run": func(context.Context, runtime.Request) error { return nil }})
}

// A handler that ignores its context and outlives its timeout is never a
// success, whether or not a shutdown cancels the run's context meanwhile:
// when the timeout came first the attempt timed out; when the shutdown came
// first it is given back uncharged (an infrastructure error). A handler
// that returns nil within its timeout after the shutdown succeeded
// (docs/embedding.md#go-handlers).
func TestFuncOutlivedTimeoutIsNeverASuccess(t *testing.T) {
	for _, tc := range []struct {
		name         string
		runs, stopAt time.Duration // the rule's timeout is 1s
		want         string        // timed out, uncharged or success
	}{
		{"timeout, then shutdown", 3 * time.Second, 1800 * time.Millisecond, "timed out"},
		{"shutdown, then past the timeout", 3 * time.Second, 500 * time.Millisecond, "uncharged"},
		{"shutdown, then done within the timeout", 800 * time.Millisecond, 500 * time.Millisecond, "success"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := runtime.NewFunc(map[string]runtime.HandlerFunc{"shop/orders.charge": func(context.Context, runtime.Request) error {
					time.Sleep(tc.runs) // whatever its context says
					return nil
				}})
				ctx, cancel := context.WithCancel(t.Context())
				time.AfterFunc(tc.stopAt, cancel)
				_, err := f.Run(ctx, runtime.Request{App: "shop", Handler: "orders.charge", Timeout: time.Second, Attempt: 1})
				ee, isExit := errors.AsType[*runtime.ExitError](err)
				got := "other"
				switch {
				case err == nil:
					got = "success"
				case isExit && ee.TimedOut:
					got = "timed out"
				case !isExit && errors.Is(err, context.Canceled):
					got = "uncharged"
				}
				if got != tc.want {
					t.Errorf("Run returned %v (%s), want %s", err, got, tc.want)
				}
			})
		})
	}
}
