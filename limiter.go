package relay

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/invocation"
)

// Limiter holds the concurrency slots of invocations
// (docs/delivery.md#concurrency-and-heartbeat): at most max run at once, and at most
// min(app concurrency, max) of one app. An Engine makes its own; the
// Engines of a worker.Worker share one, so MAX_CONCURRENCY and each app's
// concurrency bound the worker as a whole whatever the number of streams.
// Safe for concurrent use.
type Limiter struct {
	max    int
	global chan struct{}

	mu     sync.Mutex
	perApp map[appSlotsKey]chan struct{}
	// newest is the bound each app's slots were last made with.
	newest map[string]int
}

// appSlotsKey names one app's slots. An app whose concurrency changes (a
// reloaded template) gets new slots; invocations running under the old
// bound release the old ones.
type appSlotsKey struct {
	name        string
	concurrency int
}

// NewLimiter returns a Limiter of max slots; max must be > 0.
func NewLimiter(max int) (*Limiter, error) {
	if max <= 0 {
		return nil, fmt.Errorf("relay: NewLimiter: max must be > 0, got %d", max)
	}
	return &Limiter{max: max, global: make(chan struct{}, max), perApp: map[appSlotsKey]chan struct{}{}, newest: map[string]int{}}, nil
}

// Max returns the worker-global bound.
func (l *Limiter) Max() int { return l.max }

// app returns the slots of a, made on first use with the app's concurrency
// (capped at max).
func (l *Limiter) app(a *app.App) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := appSlotsKey{a.Name, a.Concurrency}
	s, ok := l.perApp[k]
	if !ok {
		s = make(chan struct{}, max(1, min(a.Concurrency, l.max)))
		l.perApp[k] = s
		l.newest[a.Name] = cap(s)
	}
	return s
}

// rule returns the worker's slots of rule handler of a when it bounds its
// own concurrency per worker (app.Limits.Concurrency, app.ScopeWorker),
// made on first use; nil otherwise.
func (l *Limiter) rule(a *app.App, handler string, lim app.Limits) chan struct{} {
	if lim.Concurrency <= 0 || lim.Scope != app.ScopeWorker {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	k := appSlotsKey{invocation.Field(a.Name, handler), lim.Concurrency}
	s, ok := l.perApp[k]
	if !ok {
		s = make(chan struct{}, max(1, min(lim.Concurrency, l.max)))
		l.perApp[k] = s
	}
	return s
}

// slots are the slots one attempt holds: its app's, its rule's when the
// rule bounds itself, and a global one, in the order they are taken. A
// value, so that taking them allocates nothing.
type slots struct {
	c [3]chan struct{}
	n int
}

// release gives the first n back.
func (s slots) release() { s.releaseFirst(s.n) }

func (s slots) releaseFirst(n int) {
	for i := range n {
		<-s.c[i]
	}
}

// slotsOf are the slots an attempt of rule handler of a needs, with lim
// its flow control.
func (l *Limiter) slotsOf(a *app.App, handler string, lim app.Limits) slots {
	if r := l.rule(a, handler, lim); r != nil {
		return slots{c: [3]chan struct{}{l.app(a), r, l.global}, n: 3}
	}
	return slots{c: [3]chan struct{}{l.app(a), l.global}, n: 2}
}

// tryAcquire takes every one of want if all are free now.
func (l *Limiter) tryAcquire(want slots) (_ slots, ok bool) {
	for i := range want.n {
		select {
		case want.c[i] <- struct{}{}:
		default:
			want.releaseFirst(i)
			return slots{}, false
		}
	}
	return want, true
}

// waitAcquire takes every one of want, in order, waiting at most wait in
// all.
func (l *Limiter) waitAcquire(ctx context.Context, want slots, wait time.Duration) (_ slots, ok bool) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for i := range want.n {
		select {
		case want.c[i] <- struct{}{}:
			continue
		case <-timer.C:
		case <-ctx.Done():
		}
		want.releaseFirst(i)
		return slots{}, false
	}
	return want, true
}

// AppSlots is how many of one app's concurrency slots are taken on a
// Limiter, and its bound there (min(concurrency, the Limiter's max)).
type AppSlots struct {
	App          string
	InUse, Limit int
}

// InUse returns the slots taken now: the worker-global count, and per app
// that ever ran here, sorted by app. An app whose
// concurrency changed (a reload) counts the runs under both bounds, and
// Limit is the newest. Safe for concurrent use.
func (l *Limiter) InUse() (global int, apps []AppSlots) {
	l.mu.Lock()
	defer l.mu.Unlock()
	byApp := map[string]*AppSlots{}
	for k, s := range l.perApp {
		if strings.Contains(k.name, "/") {
			continue // a rule's own slots
		}
		a := byApp[k.name]
		if a == nil {
			a = &AppSlots{App: k.name}
			byApp[k.name] = a
		}
		a.InUse += len(s)
		a.Limit = l.newest[k.name]
	}
	for _, a := range byApp {
		apps = append(apps, *a)
	}
	slices.SortFunc(apps, func(a, b AppSlots) int { return strings.Compare(a.App, b.App) })
	return len(l.global), apps
}
