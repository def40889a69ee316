package relay

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Running is one handler attempt running now on an Engine
// (docs/console.md, docs/operations.md#stalled-handlers): what relay health and the
// console show to tell a hung handler from a slow one.
type Running struct {
	App, Handler string
	// MessageID is the stream entry the attempt runs for.
	MessageID string
	// Attempt is the attempt's number; MaxAttempts the rule's retries + 1.
	Attempt, MaxAttempts int
	// Started is when the Runner was called; Timeout is the rule's timeout
	// (0: none). An attempt running past Started+Timeout is stalled: its
	// runtime failed to stop it.
	Started time.Time
	Timeout time.Duration
	// LeaseUntil is when its running lease expires (the Redis clock).
	LeaseUntil time.Time
	// Orphaned is set once the Engine's heartbeat found the attempt's
	// message no longer pending in the consumer group (another consumer
	// acknowledged it, or Redis lost its data): its outcome cannot be
	// recorded, and the Engine is stopping its handler.
	Orphaned bool
}

// Stalled reports whether r has run past its timeout at now.
func (r Running) Stalled(now time.Time) bool {
	return r.Timeout > 0 && now.Sub(r.Started) > r.Timeout
}

// runningSet holds the attempts an Engine runs, by lease token. Safe for
// concurrent use.
type runningSet struct {
	mu  sync.Mutex
	all map[string]*Running
}

func newRunningSet() *runningSet { return &runningSet{all: map[string]*Running{}} }

// add records r under token; the returned func removes it.
func (s *runningSet) add(token string, r *Running) {
	s.mu.Lock()
	s.all[token] = r
	s.mu.Unlock()
}

// remove forgets the attempt of token once it ended.
func (s *runningSet) remove(token string) {
	s.mu.Lock()
	delete(s.all, token)
	s.mu.Unlock()
}

// orphan marks the attempts of the messages of ids orphaned.
func (s *runningSet) orphan(ids []string) {
	gone := make(map[string]bool, len(ids))
	for _, id := range ids {
		gone[id] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.all {
		if gone[r.MessageID] {
			r.Orphaned = true
		}
	}
}

// list returns a copy of every running attempt, oldest first.
func (s *runningSet) list() []Running {
	s.mu.Lock()
	out := make([]Running, 0, len(s.all))
	for _, r := range s.all {
		out = append(out, *r)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Running) int {
		return cmp.Or(a.Started.Compare(b.Started), cmp.Compare(a.MessageID, b.MessageID))
	})
	return out
}

// Running returns the handler attempts this Engine runs now, oldest first
// (docs/console.md). Safe for concurrent use.
func (e *Engine) Running() []Running { return e.p.runs.list() }
