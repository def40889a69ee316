package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"time"
)

// HandlerFunc is an in-process handler. It gets the request (event, app,
// handler, attempt) and returns nil on success; an error wrapping
// ErrPermanent (Permanent) fails the invocation for good. ctx is cancelled
// when the request's timeout expires, or when the worker gives up on
// running handlers at shutdown (Config.ShutdownTimeout after it began
// draining); a handler must return promptly then, since a Go function
// cannot be killed.
type HandlerFunc func(ctx context.Context, req Request) error

// Func is a Runner that calls Go functions in-process instead of starting
// processes. It is meant for library users embedding Relay without
// containers, and for tests. Safe for concurrent use.
type Func struct {
	handlers   map[string]HandlerFunc
	middleware []Middleware
}

// NewFunc returns a Func serving handlers, keyed by "<app>/<handler>" or, to
// serve a handler name without a "/" in every app, by "<handler>" alone;
// the app-specific key wins. The map is copied. It panics naming the key when a function is
// nil, which is a programming error (CheckHandlers would otherwise report
// that key both as missing and as registered).
func NewFunc(handlers map[string]HandlerFunc, opts ...FuncOption) *Func {
	for _, k := range slices.Sorted(maps.Keys(handlers)) {
		if handlers[k] == nil {
			panic(fmt.Sprintf("runtime: NewFunc: the function of %q is nil", k))
		}
	}
	f := &Func{handlers: maps.Clone(handlers)}
	for _, o := range opts {
		o(f)
	}
	return f
}

// PanicError is the cause of an *ExitError for a handler that panicked.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// errTimedOut is the context cause set when a request's timeout expires.
var errTimedOut = errors.New("runtime: handler timeout")

// Run calls the handler registered for req and waits for it to return.
//
// Outcomes: nil on success; *ExitError{Code: 127} when no handler is
// registered; *ExitError{Code: 1, Err: err} when it returns err
// (Code ExitPermanent when err wraps ErrPermanent);
// *ExitError{Code: 2, Err: *PanicError} when it panics;
// *ExitError{TimedOut: true} when req.Timeout expired before it returned,
// whatever it returned, and even when ctx was cancelled after that. If ctx
// itself is cancelled (shutdown) before the timeout and the handler then
// fails, or returns only after its timeout would have expired, Run returns
// an infrastructure error wrapping ctx.Err(), which charges no attempt: a
// handler that outlived its timeout is never a success
// (docs/embedding.md#go-handlers). Result.Duration is the handler's run
// time in every case.
func (f *Func) Run(ctx context.Context, req Request) (Result, error) {
	h, ok := f.lookup(req.App, req.Handler)
	if !ok {
		return Result{}, &ExitError{Code: 127, Err: fmt.Errorf("no handler %q registered for app %q", req.Handler, req.App)}
	}
	hctx, cancel := withTimeout(ctx, req.Timeout)
	defer cancel()

	start := time.Now()
	err := callHandler(hctx, f.chain(h), req)
	res := Result{Duration: time.Since(start)}
	switch {
	case timedOut(hctx):
		return res, &ExitError{Code: 1, TimedOut: true, Timeout: req.Timeout, Err: err}
	case ctx.Err() != nil && (err != nil || outlived(req.Timeout, res.Duration)):
		return res, fmt.Errorf("run %s/%s: %w", req.App, req.Handler, ctx.Err())
	case err == nil:
		return res, nil
	}
	var pe *PanicError
	switch {
	case errors.As(err, &pe):
		return res, &ExitError{Code: 2, Err: err}
	case errors.Is(err, ErrPermanent):
		return res, &ExitError{Code: ExitPermanent, Err: err}
	}
	return res, &ExitError{Code: 1, Err: err}
}

func callHandler(ctx context.Context, h HandlerFunc, req Request) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h(ctx, req)
}

// timedOut reports whether the timeout of ctx, made by withTimeout, expired
// before its parent was cancelled: the cause is set by whichever came
// first, so a shutdown after the timeout does not hide it.
func timedOut(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errTimedOut) }

// outlived reports whether a run that took took went past timeout (> 0).
// A shutdown cancels the timeout's timer with the run's context, so a
// handler that ignores its context and returns after both is caught here.
func outlived(timeout, took time.Duration) bool { return timeout > 0 && took >= timeout }

// withTimeout bounds ctx by d (no bound when d <= 0); expiry sets the cause
// errTimedOut so that it can be told apart from the parent's cancellation.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeoutCause(ctx, d, errTimedOut)
}
