package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/runtime"
)

// ErrOpen is returned by Breaker.Run, wrapped together with
// runtime.ErrUnavailable, while a handler's circuit is open.
var ErrOpen = errors.New("circuit breaker open")

// State is the state of one handler's circuit.
type State int

const (
	// Closed: runs go through to the wrapped Runner.
	Closed State = iota
	// Open: runs are refused without calling the wrapped Runner.
	Open
	// HalfOpen: the cool-down is over and one trial run goes through; its
	// outcome closes the circuit or opens it again.
	HalfOpen
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return "unknown"
}

// Breaker is a relay.Runner that wraps another Runner with one circuit
// breaker per handler ("<app>/<handler>"). After threshold consecutive
// handler failures (errors wrapping *runtime.ExitError, timeouts included)
// the handler's circuit opens: for the cool-down, Run refuses the handler
// without running it and returns an error wrapping both ErrOpen and
// runtime.ErrUnavailable. The Engine treats that as an infrastructure
// failure (relay.Runner): it charges no attempt, releases the claim and
// leaves the message pending, so a reclaim after MinPendingIdle tries
// again. After the cool-down one trial run goes through; success closes the
// circuit, another handler failure opens it for a further cool-down.
//
// Infrastructure errors of the wrapped Runner pass through unchanged and
// neither count as failures nor reset the count: they say nothing about the
// handler. Breaker forwards Sweep to a wrapped relay.Sweeper and
// CheckHandlers to a wrapped runtime.HandlerChecker (the runtime.Func of
// this example), since the Worker and the Engine find those capabilities
// by type assertion on the outermost Runner: without CheckHandlers a rule
// naming a Go function that is not registered would pass the start check
// and fail its attempts at run time.
//
// Safe for concurrent use.
type Breaker struct {
	next      relay.Runner
	threshold int
	coolDown  time.Duration
	now       func() time.Time
	onChange  func(handler string, from, to State)

	mu       sync.Mutex
	circuits map[string]*circuit
}

type circuit struct {
	state    State
	failures int       // consecutive handler failures while closed
	until    time.Time // end of the cool-down while open
	trial    bool      // a trial run is in flight (half-open)
}

// Option configures a Breaker.
type Option func(*Breaker)

// WithClock replaces time.Now as the Breaker's clock, for tests.
func WithClock(now func() time.Time) Option { return func(b *Breaker) { b.now = now } }

// WithStateChange calls f after each change of a handler's circuit, outside
// the Breaker's lock. f must be safe for concurrent use.
func WithStateChange(f func(handler string, from, to State)) Option {
	return func(b *Breaker) { b.onChange = f }
}

// NewBreaker wraps next. threshold (>= 1) is how many consecutive handler
// failures open a circuit; coolDown (> 0) is how long it stays open.
func NewBreaker(next relay.Runner, threshold int, coolDown time.Duration, opts ...Option) (*Breaker, error) {
	switch {
	case next == nil:
		return nil, errors.New("breaker: nil Runner to wrap")
	case threshold < 1:
		return nil, fmt.Errorf("breaker: threshold must be >= 1, got %d", threshold)
	case coolDown <= 0:
		return nil, fmt.Errorf("breaker: cool-down must be > 0, got %s", coolDown)
	}
	b := &Breaker{next: next, threshold: threshold, coolDown: coolDown, now: time.Now, circuits: map[string]*circuit{}}
	for _, o := range opts {
		o(b)
	}
	return b, nil
}

// Run runs req through the wrapped Runner unless its handler's circuit is
// open (or a trial run of it is in flight), and records the outcome.
func (b *Breaker) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	key := req.App + "/" + req.Handler
	if err := b.admit(key); err != nil {
		return runtime.Result{}, err
	}
	res, err := b.next.Run(ctx, req)
	b.record(key, err)
	return res, err
}

// State returns the circuit state of handler key ("<app>/<handler>").
func (b *Breaker) State(key string) State {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.circuits[key]; ok {
		return c.state
	}
	return Closed
}

// Sweep forwards to the wrapped Runner when it is a relay.Sweeper.
func (b *Breaker) Sweep(ctx context.Context) error {
	if s, ok := b.next.(relay.Sweeper); ok {
		return s.Sweep(ctx)
	}
	return nil
}

// CheckHandlers forwards to the wrapped Runner when it is a
// runtime.HandlerChecker; any other Runner says nothing of its handlers.
func (b *Breaker) CheckHandlers(targets []runtime.Target) error {
	if hc, ok := b.next.(runtime.HandlerChecker); ok {
		return hc.CheckHandlers(targets)
	}
	return nil
}

// admit decides whether a run of key may start.
func (b *Breaker) admit(key string) error {
	b.mu.Lock()
	c := b.circuit(key)
	from := c.state
	switch {
	case c.state == Open && b.now().Before(c.until):
		until := c.until
		b.mu.Unlock()
		return fmt.Errorf("run %s: %w until %s: %w", key, ErrOpen, until.Format(time.RFC3339Nano), runtime.ErrUnavailable)
	case c.state == Open:
		c.state, c.trial = HalfOpen, true
	case c.state == HalfOpen && c.trial:
		b.mu.Unlock()
		return fmt.Errorf("run %s: %w: a trial run is in flight: %w", key, ErrOpen, runtime.ErrUnavailable)
	case c.state == HalfOpen:
		c.trial = true
	}
	to := c.state
	b.mu.Unlock()
	b.changed(key, from, to)
	return nil
}

// record updates key's circuit with the outcome of a run it admitted.
func (b *Breaker) record(key string, err error) {
	b.mu.Lock()
	c := b.circuit(key)
	from := c.state
	var exit *runtime.ExitError
	switch {
	case err == nil:
		c.state, c.failures, c.trial = Closed, 0, false
	case errors.As(err, &exit):
		c.failures++
		if c.state == HalfOpen || c.failures >= b.threshold {
			c.state, c.failures, c.trial, c.until = Open, 0, false, b.now().Add(b.coolDown)
		}
	default:
		// Not the handler's fault: a trial that could not run gives its
		// turn to the next run.
		c.trial = false
	}
	to := c.state
	b.mu.Unlock()
	b.changed(key, from, to)
}

// circuit returns key's circuit, creating it closed. b.mu must be held.
func (b *Breaker) circuit(key string) *circuit {
	c, ok := b.circuits[key]
	if !ok {
		c = &circuit{}
		b.circuits[key] = c
	}
	return c
}

func (b *Breaker) changed(key string, from, to State) {
	if from != to && b.onChange != nil {
		b.onChange(key, from, to)
	}
}
