package relay

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/invocation"
)

// detached returns a context for one write that records what a delivery
// did: it survives the worker's stop (a stopping worker still records what
// its handlers did) and ends after the write timeout.
func (e *Engine) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), e.cfg.WriteTimeout)
}

// persist runs an idempotent or fenced write until it succeeds, fails with
// a contract error (invocation.ErrStale, ErrTerminal), or the write timeout
// passes, backing off between tries: a Redis blip as a handler finishes
// must not turn its recorded outcome into a lost one. A fenced write whose
// earlier try applied but whose reply was lost comes back ErrStale; the
// message then stays pending and the next delivery's Claim reads the truth.
func (e *Engine) persist(ctx context.Context, op func(context.Context) error) error {
	octx, cancel := e.detached(ctx)
	defer cancel()
	return retryWrite(octx, op)
}

// persistSuccess is persist for the record of a handler's success, which
// is worth waiting longer for: a success that is not recorded makes the
// lease expire and count as a failed attempt, so the handler runs again or
// is dead-lettered. While this delivery retries, its message stays held
// and heartbeated, so no other delivery claims the invocation, and the
// fenced write still applies when Redis is back. It retries until the
// lease's deadline plus MinPendingIdle (at least the write timeout), or
// until the worker abandons running work (runCtx).
func (e *Engine) persistSuccess(ctx, runCtx context.Context, l invocation.Lease, op func(context.Context) error) error {
	patience := max(e.cfg.WriteTimeout, time.Until(l.Deadline)+e.cfg.MinPendingIdle)
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), patience)
	defer cancel()
	defer context.AfterFunc(runCtx, cancel)()
	return retryWrite(octx, op)
}

func retryWrite(octx context.Context, op func(context.Context) error) error {
	for tries := 1; ; tries++ {
		err := op(octx)
		if err == nil || errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal) {
			return err
		}
		if !ctxtime.Sleep(octx, retryDelay(tries)) {
			return err
		}
	}
}

// retryDelay is a jittered exponential backoff for infrastructure errors:
// 100ms doubling to 5s.
func retryDelay(fails int) time.Duration {
	d := 100 * time.Millisecond << min(fails-1, 6)
	d = min(d, 5*time.Second)
	return d/2 + rand.N(d/2+1)
}
