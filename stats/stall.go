package stats

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/relaydev/relay/internal/plural"
)

// The kinds of Stall (docs/operations.md#stalled-handlers).
const (
	// StallPastTimeout: an attempt has run past its rule's timeout, so its
	// runtime failed to stop it (a hung handler); it holds its slots
	// until it ends.
	StallPastTimeout = "past_timeout"
	// StallLost: an attempt runs for a message Redis no longer has
	// pending for its worker (lost with Redis's data, deleted, or taken
	// over by another worker); it holds its slots until it ends.
	StallLost = "lost"
	// StallSlotsFull: every slot of an app on a worker is taken by
	// attempts that have each run at least SlotsStuckAfter (or are past
	// their timeout, or lost), and other messages are pending: queued
	// work waits for a slot.
	StallSlotsFull = "slots_full"
)

// SlotsStuckAfter is how long the youngest attempt holding an app's full
// slots has run before the waiting work counts as a stall: shorter runs
// are a busy app, not a stuck one.
const SlotsStuckAfter = time.Minute

// RecreationShownFor is how long after a worker recreated its consumer
// group relay health warns and the console shows a banner.
const RecreationShownFor = time.Hour

// Stall is one reason the work of a stream does not move, as Stalls finds
// it in the workers' status.
type Stall struct {
	Kind     string
	Consumer string
	App      string
	// Run is the attempt concerned (StallPastTimeout, StallLost).
	Run Run
	// Slots are the app's slots on the worker, Youngest how long the
	// youngest attempt holding them has run, and Waiting how many other
	// messages are pending (StallSlotsFull).
	Slots    AppSlots
	Youngest time.Duration
	Waiting  int64
	// At is when Stalls looked, for the running times.
	At time.Time
}

// Stalls lists what keeps the work of one stream from moving, from the
// status of its workers at now: every attempt past its timeout or whose
// message is lost, then every app whose slots are stuck full while other
// messages wait. pending is the stream's pending count (XPENDING), < 0
// when unknown: then full slots are not judged. Sorted by consumer, then
// kind and app.
func Stalls(workers []WorkerStatus, pending int64, now time.Time) []Stall {
	var out []Stall
	var live int64 // attempts whose message is still pending
	for _, w := range workers {
		for _, r := range w.Running {
			switch {
			case r.Lost:
				out = append(out, Stall{Kind: StallLost, Consumer: w.Consumer, App: r.App, Run: r, At: now})
			case r.PastTimeout(now):
				out = append(out, Stall{Kind: StallPastTimeout, Consumer: w.Consumer, App: r.App, Run: r, At: now})
			}
			if !r.Lost {
				live++
			}
		}
	}
	if waiting := pending - live; pending >= 0 && waiting > 0 {
		for _, w := range workers {
			if w.Slots == nil {
				continue
			}
			for _, a := range w.Slots.Apps {
				if s, ok := stuck(w, a, now); ok {
					s.Waiting = waiting
					out = append(out, s)
				}
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Stall) int {
		return cmp.Or(cmp.Compare(a.Consumer, b.Consumer), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.App, b.App))
	})
	return out
}

// stuck reports whether app a's slots on worker w are full and held by
// attempts of w's stream that each ran SlotsStuckAfter, or that are past
// their timeout or lost.
func stuck(w WorkerStatus, a AppSlots, now time.Time) (Stall, bool) {
	if !a.Full() {
		return Stall{}, false
	}
	youngest, held := time.Duration(-1), false
	for _, r := range w.Running {
		if r.App != a.App {
			continue
		}
		d := now.Sub(r.Started)
		if youngest < 0 || d < youngest {
			youngest = d
		}
		held = held || r.Lost || r.PastTimeout(now)
	}
	if youngest < 0 || !held && youngest < SlotsStuckAfter {
		return Stall{}, false
	}
	return Stall{Kind: StallSlotsFull, Consumer: w.Consumer, App: a.App, Slots: a, Youngest: youngest, At: now}, true
}

// String says s in one line, with what to do.
func (s Stall) String() string {
	r := s.Run
	attempt := fmt.Sprintf("attempt %d", r.Attempt)
	if r.MaxAttempts > 0 {
		attempt += fmt.Sprintf(" of %d", r.MaxAttempts)
	}
	switch s.Kind {
	case StallPastTimeout:
		return fmt.Sprintf("%s on %s has run for %s, past its %s timeout (message %s, %s): the runtime did not stop it, and it holds a slot of app %s until it ends; "+
			"look at the handler and the runtime (containerd), or restart the worker", r.Target(), s.Consumer, Round(s.At.Sub(r.Started)), r.Timeout(), r.MessageID, attempt, r.App)
	case StallLost:
		return fmt.Sprintf("%s on %s runs for message %s (%s, for %s), which Redis no longer has pending for %s (lost with Redis's data, deleted, or taken over by another worker): "+
			"it holds a slot of app %s until it ends, and its outcome is not recorded", r.Target(), s.Consumer, r.MessageID, attempt, Round(s.At.Sub(r.Started)), s.Consumer, r.App)
	case StallSlotsFull:
		return fmt.Sprintf("app %s: all %s taken on %s by attempts running for %s or more, and %s pending: queued work waits for a slot",
			s.App, plural.Of(s.Slots.Limit, "slot"), s.Consumer, Round(s.Youngest), plural.Of(int(s.Waiting), "other message"))
	}
	return s.Kind
}

// Round rounds a running time for people: to the second from a second
// on, to the millisecond below.
func Round(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

// Recreation is a worker's report that it created its consumer group
// again (docs/operations.md#redis-lost-its-data).
type Recreation struct {
	Consumer string
	Times    int
	At       time.Time
}

// Recreations returns the workers that recreated their group within
// RecreationShownFor of now, newest first.
func Recreations(workers []WorkerStatus, now time.Time) []Recreation {
	var out []Recreation
	for _, w := range workers {
		if w.GroupRecreations > 0 && now.Sub(w.GroupRecreatedAt) < RecreationShownFor {
			out = append(out, Recreation{Consumer: w.Consumer, Times: w.GroupRecreations, At: w.GroupRecreatedAt})
		}
	}
	slices.SortFunc(out, func(a, b Recreation) int { return b.At.Compare(a.At) })
	return out
}

// String says r for group in one line, with what it means.
func (r Recreation) String(group string) string {
	return fmt.Sprintf("%s created consumer group %s again from id 0 at %s: Redis lost its data (a restart without persistence, a failover, a flush), "+
		"or the group or the stream was deleted; the pending messages, their invocation state, the dead letters and the counters from before are gone, "+
		"and the entries still in the stream are delivered again", r.Consumer, group, r.At.UTC().Format(time.RFC3339))
}
