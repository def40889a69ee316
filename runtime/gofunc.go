package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Middleware wraps a HandlerFunc of a Func: logging, metrics, tracing,
// recovering panics the way a service wants. A Middleware sees every
// attempt of every handler it wraps, with the Request, and what the
// handler returned.
type Middleware func(next HandlerFunc) HandlerFunc

// FuncOption configures a Func.
type FuncOption func(*Func)

// WithMiddleware wraps every handler of the Func in mws, the first one
// outermost: WithMiddleware(a, b) runs a, then b, then the handler.
// Panics are recovered outside every middleware, so a middleware's own
// panic fails the attempt as the handler's would.
func WithMiddleware(mws ...Middleware) FuncOption {
	return func(f *Func) { f.middleware = append(f.middleware, mws...) }
}

// chain wraps h in f's middleware.
func (f *Func) chain(h HandlerFunc) HandlerFunc {
	for i := len(f.middleware) - 1; i >= 0; i-- {
		h = f.middleware[i](h)
	}
	return h
}

// Handles reports whether f serves handler in app: a key "<app>/<handler>"
// or "<handler>" is registered.
func (f *Func) Handles(app, handler string) bool {
	_, ok := f.lookup(app, handler)
	return ok
}

// Keys returns the registered keys, sorted.
func (f *Func) Keys() []string {
	keys := make([]string, 0, len(f.handlers))
	for k := range f.handlers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (f *Func) lookup(app, handler string) (HandlerFunc, bool) {
	h, ok := f.handlers[app+"/"+handler]
	if !ok && anyApp(handler) {
		h, ok = f.handlers[handler]
	}
	return h, ok
}

// anyApp reports whether handler, registered alone, serves it in every
// app. A key holding a "/" is always "<app>/<handler>" (an app name has
// none): were a handler name "billing/invoice.pay" looked up alone, a
// template of another app could run billing's function.
func anyApp(handler string) bool { return !strings.Contains(handler, "/") }

// Target names one (app, handler) that a set of apps runs, from an event
// rule or a schedule, with the app's Spec.
type Target struct {
	App, Handler string
	Spec         Spec
}

// CheckHandlers compares the handlers that targets name with those f
// serves. It returns an error listing every target of a Go app (one
// defined in Go, or a template with runtime: go) that no function is
// registered for, and every registered key that no target uses (a typo on
// either side), or nil when they agree. Targets of container apps (an
// image, or the python3 or node runtime) may be served by f, as tests do
// to stand in for containers, but are not required to be.
func (f *Func) CheckHandlers(targets []Target) error {
	used := map[string]bool{}
	var missing []string
	for _, t := range targets {
		switch {
		case f.handlers[t.App+"/"+t.Handler] != nil:
			used[t.App+"/"+t.Handler] = true
		case anyApp(t.Handler) && f.handlers[t.Handler] != nil:
			used[t.Handler] = true
		case t.Spec.GoFunctions():
			missing = append(missing, t.App+"/"+t.Handler)
		}
	}
	var unused []string
	for _, k := range f.Keys() {
		if !used[k] {
			unused = append(unused, k)
		}
	}
	if len(missing) == 0 && len(unused) == 0 {
		return nil
	}
	sort.Strings(missing)
	return &HandlerMismatch{Missing: missing, Unused: unused}
}

// HandlerMismatch is CheckHandlers' error.
type HandlerMismatch struct {
	// Missing lists "app/handler" targets no function serves; Unused, the
	// registered keys no target names. Both sorted.
	Missing, Unused []string
}

// Refuses reports whether the mismatch stops a start: a handler has no
// function. A function that nothing names (an app removed, a handler
// renamed while retries of the old one are pending) is worth a warning only.
func (e *HandlerMismatch) Refuses() bool { return len(e.Missing) > 0 }

func (e *HandlerMismatch) Error() string {
	var parts []string
	if len(e.Missing) > 0 {
		parts = append(parts, fmt.Sprintf("no Go function registered for %s", strings.Join(e.Missing, ", ")))
	}
	if len(e.Unused) > 0 {
		parts = append(parts, fmt.Sprintf("registered but named by no rule or schedule: %s", strings.Join(e.Unused, ", ")))
	}
	return "runtime: Go handlers do not match the apps: " + strings.Join(parts, "; ")
}

// HandlerChecker is implemented by Runners that serve a fixed set of
// handlers (Func); constructors check rules against it at start.
type HandlerChecker interface {
	CheckHandlers(targets []Target) error
}

// Invocation is what a typed handler knows of the attempt it runs.
type Invocation struct {
	App, Handler string
	// MessageID is the stream entry id.
	MessageID string
	// Attempt counts from 1.
	Attempt int
	// Trace is the W3C traceparent of the attempt's span, or the
	// producer's when tracing is off; empty when neither exists.
	Trace string
}

// Typed adapts a handler of events of type T: the event JSON is decoded
// into a T with encoding/json (unknown fields are ignored, so producers
// may add fields), and h gets it with the invocation's metadata. An event
// that does not decode into T fails the attempt permanently (Permanent):
// the same event can never decode, so the invocation is dead-lettered at
// once with a reason naming the field.
func Typed[T any](h func(ctx context.Context, event T, inv Invocation) error) HandlerFunc {
	return func(ctx context.Context, req Request) error {
		var ev T
		if err := json.Unmarshal(req.Event, &ev); err != nil {
			return Permanent(fmt.Errorf("decode the event into %T: %w", ev, err))
		}
		return h(ctx, ev, Invocation{App: req.App, Handler: req.Handler, MessageID: req.MessageID,
			Attempt: req.Attempt, Trace: req.Env["TRACEPARENT"]})
	}
}
