package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/invocation"
)

// Claims whose outcome a worker did not learn (docs/delivery.md#lost-replies).
// A claim whose reply was lost (the network froze, the connection broke)
// may have run on Redis, or may still run there later, and recorded a
// lease that nothing uses; when that lease expires the next claim charges
// it as a failed attempt although no handler ran. The same holds for an
// attempt given back (Release) whose write failed. The Engine keeps the
// tokens of such claims and gives each back (ClaimVoider.Void) as soon as
// the store answers again, well before the lease can expire, retrying
// until it applies.

// unsettledClaims holds the claims to give back, by token. Safe for
// concurrent use.
type unsettledClaims struct {
	mu     sync.Mutex
	claims map[string]unsettledClaim
	// wake tells voider.run that a claim was added.
	wake chan struct{}
}

type unsettledClaim struct {
	lease invocation.Lease
	since time.Time
}

func newUnsettledClaims() *unsettledClaims {
	return &unsettledClaims{claims: map[string]unsettledClaim{}, wake: make(chan struct{}, 1)}
}

func (u *unsettledClaims) add(l invocation.Lease) {
	u.mu.Lock()
	if _, ok := u.claims[l.Token]; !ok {
		u.claims[l.Token] = unsettledClaim{lease: l, since: time.Now()}
	}
	u.mu.Unlock()
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

func (u *unsettledClaims) list() []unsettledClaim {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]unsettledClaim, 0, len(u.claims))
	for _, c := range u.claims {
		out = append(out, c)
	}
	return out
}

func (u *unsettledClaims) remove(token string) {
	u.mu.Lock()
	delete(u.claims, token)
	u.mu.Unlock()
}

func (u *unsettledClaims) len() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.claims)
}

// voider gives back the claims whose outcome a worker did not learn: it
// holds them until the store answers again (ClaimVoider.Void). Safe for
// concurrent use.
type voider struct {
	claims *unsettledClaims
	// v is the StateStore as a ClaimVoider; nil when it is not one.
	v ClaimVoider
	// writeCtx bounds one Void by the write timeout.
	writeCtx func(context.Context) context.Context
	voided   prometheus.Counter
	log      *slog.Logger
}

// add records that claim l may hold a lease that nothing will use, and
// returns whether it will be given back: the store can void claims
// (ClaimVoider). Only l's Key, Field and Token are needed.
func (vd *voider) add(l invocation.Lease) bool {
	if vd.v == nil {
		return false
	}
	vd.claims.add(l)
	return true
}

// maxVoidDelay is the longest wait between two rounds of run while
// claims stay unsettled, so that a claim is given back within about that
// long of the store answering again.
const maxVoidDelay = time.Second

// run gives back the unsettled claims until ctx ends, in rounds: at once
// when one is added, then with a backoff of up to maxVoidDelay while some
// remain.
func (vd *voider) run(ctx context.Context) {
	fails := 0
	for {
		wait := time.Duration(-1) // until woken
		if vd.claims.len() > 0 {
			wait = min(retryDelay(fails+1), maxVoidDelay)
		}
		if !vd.wait(ctx, wait) {
			return
		}
		if vd.round(ctx) {
			fails = 0
		} else {
			fails++
		}
	}
}

// wait waits for d (for ever when d < 0) or a new unsettled claim; false
// when ctx ended.
func (vd *voider) wait(ctx context.Context, d time.Duration) bool {
	if d < 0 {
		select {
		case <-ctx.Done():
			return false
		case <-vd.claims.wake:
			return true
		}
	}
	select {
	case <-vd.claims.wake:
		return true
	default:
	}
	return ctxtime.Sleep(ctx, d)
}

// round tries to give back every unsettled claim once, concurrently, each
// within the write timeout; it reports whether all were.
func (vd *voider) round(ctx context.Context) bool {
	claims := vd.claims.list()
	if vd.v == nil || len(claims) == 0 {
		return true
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	all := true
	for _, c := range claims {
		wg.Go(func() {
			err := vd.v.Void(vd.writeCtx(ctx), c.lease)
			if err != nil && !errors.Is(err, invocation.ErrTerminal) {
				mu.Lock()
				all = false
				mu.Unlock()
				return
			}
			vd.claims.remove(c.lease.Token)
			if err != nil {
				return // the message left the PEL: nothing to give back
			}
			vd.voided.Inc()
			vd.log.LogAttrs(ctx, slog.LevelInfo, "claim whose outcome was not learnt given back; no attempt charged",
				slog.String("message_id", c.lease.Key.MessageID), slog.String("invocation", c.lease.Field),
				slog.Duration("unsettled_for", time.Since(c.since).Round(time.Millisecond)))
		})
	}
	wg.Wait()
	return all
}

// flush is round at the Engine's stop: the claims it cannot give back
// within the write timeout are logged, as their leases, if they ran, will
// be charged when they expire.
func (vd *voider) flush() {
	ctx := context.Background()
	if vd.claims.len() == 0 || vd.round(ctx) {
		return
	}
	for _, c := range vd.claims.list() {
		vd.log.LogAttrs(ctx, slog.LevelWarn, "claim whose outcome was not learnt could not be given back before the engine stopped; if it ran, its lease expires and is charged as a failed attempt",
			slog.String("message_id", c.lease.Key.MessageID), slog.String("invocation", c.lease.Field))
	}
}
