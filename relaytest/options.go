package relaytest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/relaydev/relay/invocation"
)

// DefaultBlock is how long Consumer.Read waits for a new entry before it
// returns (nil, nil), unless its context ends first. It is shorter than
// redisstream.DefaultBlock because nothing is saved by blocking longer in memory,
// and an Engine's read loop then notices shutdown sooner.
const DefaultBlock = 100 * time.Millisecond

// Option configures a fake. Each option names the fakes it applies to;
// passing it to another one makes the constructor panic, as do invalid
// values: both are programming errors in a test.
type Option func(*config) error

type config struct {
	clock   Clock
	block   time.Duration
	token   func() string
	pending func(invocation.Key) bool
	stream  *Stream
	dlq     *DLQ
	// set records which options were given, by name, so a constructor can
	// reject the ones that do not apply to it.
	set map[string]bool
}

// WithClock sets the time source of a Stream, StateStore or DLQ. c must not
// be nil. Default: SystemClock.
func WithClock(c Clock) Option {
	return func(o *config) error {
		if c == nil {
			return fmt.Errorf("WithClock: nil clock")
		}
		o.clock = c
		return o.once("WithClock")
	}
}

// WithBlock sets how long Consumer.Read of a Stream waits for a new entry
// before it returns (nil, nil). The wait is real time (a timer), not Clock
// time. d must be >= 1ms. Default: DefaultBlock.
func WithBlock(d time.Duration) Option {
	return func(o *config) error {
		if d < time.Millisecond {
			return fmt.Errorf("WithBlock: must be >= 1ms, got %s", d)
		}
		o.block = d
		return o.once("WithBlock")
	}
}

// WithTokenSource replaces the generator of claim tokens of a StateStore,
// for tests that assert tokens. f must be safe for concurrent use and return
// a non-empty string without ':' that no earlier claim of the same
// invocation used; a token that breaks this makes Claim fail. Default: 16
// random bytes, hex-encoded, as redisstate.Store uses.
func WithTokenSource(f func() string) Option {
	return func(o *config) error {
		if f == nil {
			return fmt.Errorf("WithTokenSource: nil function")
		}
		o.token = f
		return o.once("WithTokenSource")
	}
}

// WithPending tells a StateStore whether a message is in its consumer
// group's PEL, as redisstate.Store asks Redis in every transition
// (docs/delivery.md#invocation-state): a claim or settlement of a message
// that is not is inert (Terminal, ErrTerminal), and a Cleared settlement
// refuses one that is. f is called with the fake's lock held, must be
// safe for concurrent use and must not call the fake. Beside a Stream,
// give WithStream instead. Default: the store does not know the PEL;
// every message counts as pending, and a Cleared settlement trusts its
// caller that the message left the PEL.
func WithPending(f func(key invocation.Key) bool) Option {
	return func(o *config) error {
		if f == nil {
			return fmt.Errorf("WithPending: nil function")
		}
		o.pending = f
		return o.once("WithPending")
	}
}

// WithStream gives a StateStore the Stream whose messages it keeps state
// of, as redisstate.Store and redisstream.Source share one Redis: its PEL
// fences every transition (as WithPending does), and Settle acknowledges on
// it. s must not be nil.
func WithStream(s *Stream) Option {
	return func(o *config) error {
		if s == nil {
			return fmt.Errorf("WithStream: nil Stream")
		}
		o.stream = s
		return o.once("WithStream")
	}
}

// WithDLQ gives a StateStore the dead-letter queue its Settle writes
// entries to, in the same step as their ":dlq" markers, as
// redisstate.Store writes keys.DLQ of the stream. d must not be nil.
func WithDLQ(d *DLQ) Option {
	return func(o *config) error {
		if d == nil {
			return fmt.Errorf("WithDLQ: nil DLQ")
		}
		o.dlq = d
		return o.once("WithDLQ")
	}
}

func (o *config) once(name string) error {
	if o.set[name] {
		return fmt.Errorf("%s given twice", name)
	}
	o.set[name] = true
	return nil
}

// buildConfig applies opts for the constructor named fn, which accepts only
// the options in allowed, and fills defaults. It panics on a bad option.
func buildConfig(fn string, opts []Option, allowed ...string) config {
	o := config{clock: SystemClock{}, block: DefaultBlock, token: randomToken, set: map[string]bool{}}
	for _, opt := range opts {
		if opt == nil {
			panic("relaytest: " + fn + ": nil Option")
		}
		if err := opt(&o); err != nil {
			panic("relaytest: " + fn + ": " + err.Error())
		}
	}
	for name := range o.set {
		ok := false
		for _, a := range allowed {
			ok = ok || a == name
		}
		if !ok {
			panic(fmt.Sprintf("relaytest: %s: %s does not apply (it takes %v)", fn, name, allowed))
		}
	}
	return o
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error (Go 1.24+)
	return hex.EncodeToString(b)
}
