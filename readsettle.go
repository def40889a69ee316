package relay

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/relaydev/relay/internal/combine"
	"github.com/relaydev/relay/invocation"
)

// readSettles gathers the settlements of the deliveries of one read into
// one call of each kind (docs/delivery.md#batched-transitions): every
// delivery of the read is a member that either joins, with the lease its
// settle records (BatchSettler.FinishSettleBatch) or, for a message
// without invocation state, its id to acknowledge (one Source.Ack), or
// leaves, when it settles otherwise or not at all. The batch goes when
// every member has joined or left, or SettleLinger after the first join,
// whichever comes first, so one slow handler delays the others'
// acknowledgements by the linger at most. Members that join after a batch
// went form the next one. Safe for concurrent use; each member joins or
// leaves once (delivery.settleDone).
type readSettles struct {
	src    StreamSource
	bs     BatchSettler // nil: leases are not batched
	ttl    time.Duration
	linger time.Duration

	mu     sync.Mutex
	open   int // members that have neither joined nor left
	queued []*queuedSettle
	timer  *time.Timer // runs expire while queued is not empty
}

// queuedSettle is one member's settlement waiting for its batch: a
// FinishSettle of l, or when ackID is set an acknowledgement alone.
type queuedSettle struct {
	ctx   context.Context
	l     invocation.Lease
	ackID string
	err   error
	done  chan struct{}
}

// newReadSettles returns the group of a read of n messages, nil for a
// read of one.
func (e *Engine) newReadSettles(n int) *readSettles {
	if n < 2 {
		return nil
	}
	return &readSettles{src: e.c.Source, bs: e.batchSettler, ttl: e.cfg.Retention, linger: e.cfg.SettleLinger, open: n}
}

// finishSettle records the success of d's last attempt l with its
// message's acknowledgement: in d's read's batch the first time, alone
// when d has no read group or already joined it (a retry after an error),
// or when the Settler cannot batch.
func (e *Engine) finishSettle(ctx context.Context, d *delivery, l invocation.Lease) error {
	if d.settles == nil || d.settleDone || d.settles.bs == nil {
		return e.c.Settler.FinishSettle(ctx, l, e.cfg.Retention)
	}
	d.settleDone = true
	return d.settles.join(ctx, &queuedSettle{l: l})
}

// sourceAck acknowledges d's message, which has no invocation state: in
// d's read's batch the first time, alone otherwise.
func (e *Engine) sourceAck(ctx context.Context, d *delivery) error {
	if d.settles == nil || d.settleDone {
		return e.c.Source.Ack(ctx, d.msg.ID)
	}
	d.settleDone = true
	return d.settles.join(ctx, &queuedSettle{ackID: d.msg.ID})
}

// leaveSettles takes d out of its read's batch unless it joined it: the
// others no longer wait for it.
func (d *delivery) leaveSettles() {
	if d.settles != nil && !d.settleDone {
		d.settleDone = true
		d.settles.leave()
	}
}

// join queues q for the read's batch and waits for its result. When ctx
// ends while q waits, join returns ctx's error and q is not settled; when
// it ends while q's batch is in flight, join returns ctx's error and q may
// or may not have been settled, as with any call cut short (a worker that
// abandons its work does not wait for Redis).
func (g *readSettles) join(ctx context.Context, q *queuedSettle) error {
	q.ctx, q.done = ctx, make(chan struct{})
	g.mu.Lock()
	g.open--
	g.queued = append(g.queued, q)
	if g.open == 0 {
		g.flushLocked()
	} else {
		if len(g.queued) == 1 {
			g.timer = time.AfterFunc(g.linger, g.expire)
		}
		g.mu.Unlock()
	}
	select {
	case <-q.done:
		return q.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	if i := slices.Index(g.queued, q); i >= 0 {
		g.queued = slices.Delete(g.queued, i, i+1)
		if len(g.queued) == 0 && g.timer != nil {
			// The next join's linger starts afresh.
			g.timer.Stop()
			g.timer = nil
		}
		g.mu.Unlock()
		return ctx.Err()
	}
	g.mu.Unlock()
	select {
	case <-q.done: // the batch answered as ctx ended
		return q.err
	default:
		return ctx.Err()
	}
}

// leave counts out a member that will not join; the batch goes if it was
// the last one the others waited for. It does not wait for the batch: the
// read loop leaves for a message it does not dispatch.
func (g *readSettles) leave() {
	g.mu.Lock()
	g.open--
	if g.open == 0 && len(g.queued) > 0 {
		batch := g.takeLocked()
		g.mu.Unlock()
		go g.flush(batch)
		return
	}
	g.mu.Unlock()
}

// expire sends what is queued when the linger has passed.
func (g *readSettles) expire() {
	g.mu.Lock()
	if len(g.queued) == 0 {
		g.mu.Unlock()
		return
	}
	g.flushLocked()
}

// flushLocked takes the queued settlements, unlocks g and settles them.
func (g *readSettles) flushLocked() {
	batch := g.takeLocked()
	g.mu.Unlock()
	g.flush(batch)
}

// takeLocked empties the queue and stops its linger.
func (g *readSettles) takeLocked() []*queuedSettle {
	batch := g.queued
	g.queued = nil
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	return batch
}

// flush settles batch, its leases in one FinishSettleBatch and its
// acknowledgements in one Source.Ack, and hands each member its result.
func (g *readSettles) flush(batch []*queuedSettle) {
	ctxs := make([]context.Context, len(batch))
	var leases, acks []*queuedSettle
	for i, q := range batch {
		ctxs[i] = q.ctx
		if q.ackID != "" {
			acks = append(acks, q)
		} else {
			leases = append(leases, q)
		}
	}
	ctx, cancel := combine.Detached(ctxs)
	defer cancel()
	if len(leases) > 0 {
		ls := make([]invocation.Lease, len(leases))
		for i, q := range leases {
			ls[i] = q.l
		}
		errs := g.bs.FinishSettleBatch(ctx, ls, g.ttl)
		for i, q := range leases {
			if i < len(errs) {
				q.err = errs[i]
			} else {
				q.err = fmt.Errorf("relay: FinishSettleBatch returned %d results for %d leases", len(errs), len(ls))
			}
		}
	}
	if len(acks) > 0 {
		ids := make([]string, len(acks))
		for i, q := range acks {
			ids[i] = q.ackID
		}
		err := g.src.Ack(ctx, ids...)
		for _, q := range acks {
			q.err = err
		}
	}
	for _, q := range batch {
		close(q.done)
	}
}
