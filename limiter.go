package relay

import (
	"fmt"
	"sync"
)

// Limiter holds the concurrency slots of invocations (events.md "Dispatch
// and concurrency"): at most max run at once, and at most min(app
// concurrency, max) of one app. An Engine makes its own; Engines of one
// worker that consume several streams share one through WithLimiter, so
// MAX_CONCURRENCY and each app's concurrency bound the worker as a whole.
// Safe for concurrent use.
type Limiter struct {
	max    int
	global chan struct{}

	mu     sync.Mutex
	perApp map[string]chan struct{}
}

// NewLimiter returns a Limiter of max slots; max must be > 0.
func NewLimiter(max int) (*Limiter, error) {
	if max <= 0 {
		return nil, fmt.Errorf("relay: NewLimiter: max must be > 0, got %d", max)
	}
	return &Limiter{max: max, global: make(chan struct{}, max), perApp: map[string]chan struct{}{}}, nil
}

// app returns the slots of app, made on first use with the app's
// concurrency (capped at max); the apps of one worker agree on it.
func (l *Limiter) app(a *App) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.perApp[a.Name]
	if !ok {
		s = make(chan struct{}, max(1, min(a.Concurrency, l.max)))
		l.perApp[a.Name] = s
	}
	return s
}
