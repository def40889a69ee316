package relaytest

import (
	"context"
	"fmt"
	"time"

	"github.com/relaydev/relay/invocation"
)

// Settler pairs a Consumer with a StateStore as invocation.Store pairs
// with a stream.Source on one Redis: it acknowledges a message and applies
// the retention of its state, after recording a last success with
// FinishSettle, in one atomic step, as settle.lua and finish_settle.lua
// do (docs/delivery.md#outcomes). It implements relay.Settler and
// relay.BatchSettler, so an Engine on the fakes takes the path it takes
// on Redis, and a wrapper of a Settler can be tested without Redis.
//
// Its StateStore should know the Consumer's PEL (WithPending), as a script
// does: without it every message counts as pending. Safe for concurrent
// use.
type Settler struct {
	c  *Consumer
	st *StateStore
}

// NewSettler returns the Settler of c and st. It panics when either is
// nil, which is a programming error.
func NewSettler(c *Consumer, st *StateStore) *Settler {
	if c == nil || st == nil {
		panic("relaytest: NewSettler: nil Consumer or StateStore")
	}
	return &Settler{c: c, st: st}
}

// Settle implements relay.Settler.Settle as invocation.Store.Settle does:
// a message still pending is acknowledged and its state retained with a
// TTL of ttl (deleted with 0); one no longer pending is left alone, and
// both errors are nil. retainErr is always nil.
func (s *Settler) Settle(ctx context.Context, key invocation.Key, ttl time.Duration) (ackErr, retainErr error) {
	fail := func(err error) error {
		return fmt.Errorf("ack and retain %s in %s group %s: %w", key.MessageID, key.Stream, key.Group, err)
	}
	if err := invocation.CheckRetention(ttl); err != nil {
		return fail(err), nil
	}
	if err := ctx.Err(); err != nil {
		return fail(err), nil
	}
	st := s.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.pending(key) {
		return nil, nil
	}
	if err := s.c.Ack(ctx, key.MessageID); err != nil {
		return fail(err), nil
	}
	st.retainLocked(key, ttl, nowMS(st.clock))
	return nil, nil
}

// FinishSettle implements relay.Settler.FinishSettle as
// invocation.Store.FinishSettle does: only when l's field is running with
// its attempt and token and the message is pending does the field become
// "ok", the message acknowledged and the state retained (deleted with
// ttl 0). ErrStale otherwise, ErrTerminal on retained state or a message
// no longer pending; nothing is acknowledged then.
func (s *Settler) FinishSettle(ctx context.Context, l invocation.Lease, ttl time.Duration) error {
	if err := invocation.CheckRetention(ttl); err != nil {
		return fmt.Errorf("finish and settle %s in %s: %w", l.Field, hashName(l.Key), err)
	}
	var ackErr error
	err := s.st.transition(ctx, "finish and settle", l, kindRunning, func(h *stateHash, _ stateValue, now int64) {
		if ackErr = s.c.Ack(ctx, l.Key.MessageID); ackErr != nil {
			return
		}
		h.fields[l.Field] = stateValue{kind: kindOK}
		s.st.retainLocked(l.Key, ttl, now)
	})
	if err == nil && ackErr != nil {
		err = fmt.Errorf("finish and settle %s in %s: %w", l.Field, hashName(l.Key), ackErr)
	}
	return err
}

// FinishSettleBatch implements relay.BatchSettler: FinishSettle for each
// of ls, one error per lease in ls's order.
func (s *Settler) FinishSettleBatch(ctx context.Context, ls []invocation.Lease, ttl time.Duration) []error {
	errs := make([]error, len(ls))
	for i, l := range ls {
		errs[i] = s.FinishSettle(ctx, l, ttl)
	}
	return errs
}
