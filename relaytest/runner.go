package relaytest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/relaydev/relay/runtime"
)

// Reply decides one run of a fake Runner: it returns what Runner.Run
// returns (nil for success) and may block, honouring ctx. (What an Engine
// did with an invocation is a relay.Outcome; Outcomes records those.)
type Reply func(ctx context.Context, req runtime.Request) error

// Succeed is the Reply of a handler that exits 0.
func Succeed() Reply {
	return func(context.Context, runtime.Request) error { return nil }
}

// Fail is the Reply of a handler that exits with code (> 0) and writes
// stderr as its last line: a *runtime.ExitError, so an attempt is used.
func Fail(code int, stderr string) Reply {
	return func(context.Context, runtime.Request) error {
		return &runtime.ExitError{Code: code, Stderr: stderr}
	}
}

// TimeOut is the Reply of a handler killed at its rule's timeout: a
// *runtime.ExitError with TimedOut set, so an attempt is used. It returns
// at once rather than waiting out the timeout.
func TimeOut() Reply {
	return func(_ context.Context, req runtime.Request) error {
		return &runtime.ExitError{Code: 137, TimedOut: true, Timeout: req.Timeout}
	}
}

// Unavailable is the Reply of an app that cannot run right now (image
// missing, runtime down): an error wrapping runtime.ErrUnavailable, so no
// attempt is charged and the message stays pending.
func Unavailable(reason string) Reply {
	return func(_ context.Context, req runtime.Request) error {
		return fmt.Errorf("run %s/%s: %s: %w", req.App, req.Handler, reason, runtime.ErrUnavailable)
	}
}

// Block is the Reply of a handler that runs until release is closed and
// then returns then's result. When ctx ends first (the Engine abandons it at
// shutdown) it returns an infrastructure error wrapping ctx's error, as
// runtime.Func does, so no attempt is charged.
func Block(release <-chan struct{}, then Reply) Reply {
	return func(ctx context.Context, req runtime.Request) error {
		select {
		case <-release:
			return then(ctx, req)
		case <-ctx.Done():
			return fmt.Errorf("run %s/%s: %w", req.App, req.Handler, ctx.Err())
		}
	}
}

// Hang is the Reply of a handler that never finishes on its own: it is
// killed at the request's Timeout (when > 0), which is a *runtime.ExitError
// with TimedOut set, as a real runner reports it; when ctx ends first (the
// Engine abandons it at shutdown) it returns an infrastructure error
// wrapping ctx's error, so no attempt is charged.
func Hang() Reply {
	return func(ctx context.Context, req runtime.Request) error {
		var timeout <-chan time.Time
		if req.Timeout > 0 {
			t := time.NewTimer(req.Timeout)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-timeout:
			return &runtime.ExitError{Code: 137, TimedOut: true, Timeout: req.Timeout}
		case <-ctx.Done():
			return fmt.Errorf("run %s/%s: %w", req.App, req.Handler, ctx.Err())
		}
	}
}

// Runner is a fake relay.Runner. It records every request and answers each
// run of a handler with the next Reply scripted for it; a handler with no
// outcome left succeeds. Use it to drive an Engine through failures,
// timeouts and unavailability without real handlers; use runtime.Func to
// run real Go handlers. Safe for concurrent use.
type Runner struct {
	mu       sync.Mutex
	scripts  map[string][]Reply
	requests []runtime.Request
	// ran is closed and replaced after every recorded run starts, so
	// WaitRuns can wait without polling.
	ran chan struct{}
}

// NewRunner returns a Runner on which every handler succeeds until scripted.
func NewRunner() *Runner {
	return &Runner{scripts: map[string][]Reply{}, ran: make(chan struct{})}
}

// Script appends outcomes for the handler key "<app>/<handler>": its next
// runs take them in order.
func (r *Runner) Script(key string, outcomes ...Reply) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.scripts[key] = append(r.scripts[key], outcomes...)
}

// CheckHandlers makes Runner a runtime.HandlerChecker that serves every
// handler (one with nothing scripted succeeds), so an Engine on it does
// not warn that the Go handlers of its apps cannot be checked.
func (r *Runner) CheckHandlers([]runtime.Target) error { return nil }

// Run records req and returns the next scripted outcome of its handler.
// Result.Duration is the time the outcome took.
func (r *Runner) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	key := req.App + "/" + req.Handler
	r.mu.Lock()
	r.requests = append(r.requests, cloneRequest(req))
	out := Succeed()
	if q := r.scripts[key]; len(q) > 0 {
		out, r.scripts[key] = q[0], q[1:]
	}
	close(r.ran)
	r.ran = make(chan struct{})
	r.mu.Unlock()

	start := time.Now()
	err := out(ctx, req)
	return runtime.Result{Duration: time.Since(start)}, err
}

// Requests returns the requests of handler key "<app>/<handler>" in the
// order their runs started, or every request when key is "".
func (r *Runner) Requests(key string) []runtime.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []runtime.Request
	for _, req := range r.requests {
		if key == "" || req.App+"/"+req.Handler == key {
			out = append(out, cloneRequest(req))
		}
	}
	return out
}

// WaitRuns blocks until at least n runs of handler key ("" for any handler)
// have started, and returns their requests; it returns ctx's error when ctx
// ends first.
func (r *Runner) WaitRuns(ctx context.Context, key string, n int) ([]runtime.Request, error) {
	for {
		r.mu.Lock()
		ran := r.ran
		r.mu.Unlock()
		if reqs := r.Requests(key); len(reqs) >= n {
			return reqs, nil
		}
		select {
		case <-ran:
		case <-ctx.Done():
			return nil, fmt.Errorf("relaytest: waiting for %d runs of %q: %w", n, key, ctx.Err())
		}
	}
}

func cloneRequest(req runtime.Request) runtime.Request {
	req.Event = slices.Clone(req.Event)
	req.Env = maps.Clone(req.Env)
	return req
}
