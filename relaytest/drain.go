package relaytest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/relaydev/relay"
)

// DrainPoll is how often WaitDrained looks at the stream. Inside a
// testing/synctest bubble it is virtual time.
const DrainPoll = 10 * time.Millisecond

// WaitDrained waits until every entry of s was delivered and acknowledged
// (no lag, nothing pending), or ctx ends; the error then says what was
// still pending. An Engine that retries with its default backoff drains
// only after those minutes: run it in a testing/synctest bubble, where they
// pass in no time, or set a short relay.Config.Backoff.
func WaitDrained(ctx context.Context, s *Stream) error {
	for {
		if s.Lag() == 0 && len(s.Pending()) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("relaytest: stream not drained (%d undelivered, pending %+v): %w", s.Lag(), s.Pending(), ctx.Err())
		case <-time.After(DrainPoll):
		}
	}
}

// Outcomes records what an Engine did with every invocation: set Record as
// relay.Config.OnOutcome, then ask what happened by message id or handler.
// Safe for concurrent use.
type Outcomes struct {
	mu   sync.Mutex
	list []Recorded
}

// Recorded is one outcome and the message it belongs to.
type Recorded struct {
	MessageID string
	relay.Outcome
}

// Record is a relay.Config.OnOutcome.
func (r *Outcomes) Record(_ context.Context, messageID string, o relay.Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, Recorded{MessageID: messageID, Outcome: o})
}

// All returns every outcome recorded so far, in the order they were reported.
func (r *Outcomes) All() []Recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list)
}

// Of returns the outcomes of one message's invocation of app's handler, in
// order: one per delivery that reached it, those that ran nothing included
// (a redelivery before the retry was due is NotDue, one while another
// delivery held the lease is Leased). Ran returns only the attempts.
func (r *Outcomes) Of(messageID, app, handler string) []relay.Outcome {
	var out []relay.Outcome
	for _, o := range r.All() {
		if o.MessageID == messageID && o.App == app && o.Handler == handler {
			out = append(out, o.Outcome)
		}
	}
	return out
}

// Ran returns the outcomes of the attempts of one message's invocation of
// app's handler that ran a handler, in order: count retries with it.
func (r *Outcomes) Ran(messageID, app, handler string) []relay.Outcome {
	var out []relay.Outcome
	for _, o := range r.Of(messageID, app, handler) {
		if o.Result != "" && o.Result != relay.ResultUnavailable {
			out = append(out, o)
		}
	}
	return out
}

// Final returns the last outcome of that invocation and whether there is
// one: for a drained stream, Succeeded or DeadLettered (or Dropped).
func (r *Outcomes) Final(messageID, app, handler string) (relay.Outcome, bool) {
	all := r.Of(messageID, app, handler)
	if len(all) == 0 {
		return relay.Outcome{}, false
	}
	return all[len(all)-1], true
}
