package relay

import (
	"cmp"
	"container/heap"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/relaydev/relay/stream"
)

// later keeps the messages this worker left pending whose next step has a
// known time (a retry's due time, the end of another delivery's lease),
// and delivers each again at that time, so a retry starts on time rather
// than a reclaim cycle late (docs/delivery.md#attempts-retries-backoff).
// It is the owning worker's own timer: the messages stay in the PEL,
// owned by this consumer and heartbeated while they wait, and when the
// worker dies the reclaim of another worker takes them over, which then
// waits for the due time in its own later. Bounded by Config.MaxWaiting
// messages; beyond that, and for messages without a known time, the
// reclaim is the only way back. Safe for concurrent use.
type later struct {
	max int

	mu    sync.Mutex
	items laterHeap
	byID  map[string]*laterItem
	// wake tells run that the earliest due time may have changed.
	wake chan struct{}
}

type laterItem struct {
	msg stream.Message
	due time.Time
	// waits are its invocations that wait for a flow-control limit.
	waits []waitOf
	index int // in the heap
}

func newLater(max int) *later {
	return &later{max: max, byID: map[string]*laterItem{}, wake: make(chan struct{}, 1)}
}

// add keeps msg for delivery at due, its invocations of waits waiting for
// their limits, and reports whether it does: not when the set is full (or
// disabled). A message kept already gets the new time.
func (l *later) add(msg stream.Message, due time.Time, waits []waitOf) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if it, ok := l.byID[msg.ID]; ok {
		it.msg, it.due, it.waits = msg, due, waits
		heap.Fix(&l.items, it.index)
	} else {
		if len(l.byID) >= l.max {
			return false
		}
		it := &laterItem{msg: msg, due: due, waits: waits}
		heap.Push(&l.items, it)
		l.byID[msg.ID] = it
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return true
}

// drop forgets the messages of ids (no longer pending, or delivered
// again by a reclaim).
func (l *later) drop(ids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if it, ok := l.byID[id]; ok {
			heap.Remove(&l.items, it.index)
			delete(l.byID, id)
		}
	}
}

// ids lists the messages kept, for the heartbeat.
func (l *later) ids() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.byID))
	for id := range l.byID {
		out = append(out, id)
	}
	return out
}

// waiting counts the kept invocations that wait for a limit, by rule
// and limit, sorted.
func (l *later) waiting() []Waiting {
	l.mu.Lock()
	defer l.mu.Unlock()
	byRule := map[waitOf]*Waiting{}
	for _, it := range l.items {
		for _, w := range it.waits {
			c := byRule[w]
			if c == nil {
				c = &Waiting{App: w.app, Handler: w.handler, Limit: w.limit}
				byRule[w] = c
			}
			c.Count++
			if t := entryTime(it.msg.ID); !t.IsZero() && (c.Oldest.IsZero() || t.Before(c.Oldest)) {
				c.Oldest = t
			}
		}
	}
	out := make([]Waiting, 0, len(byRule))
	for _, c := range byRule {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b Waiting) int {
		return cmp.Or(cmp.Compare(a.App, b.App), cmp.Compare(a.Handler, b.Handler), cmp.Compare(a.Limit, b.Limit))
	})
	return out
}

// entryTime is the time in stream entry id id, zero when it has none.
func entryTime(id string) time.Time {
	ms, _, err := stream.ParseID(id)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(int64(ms))
}

// len is how many messages are kept.
func (l *later) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byID)
}

// next pops the messages due at now, and returns the time of the next one
// (zero when none is kept).
func (l *later) next(now time.Time) (due []stream.Message, wait time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.items) > 0 && !l.items[0].due.After(now) {
		it := heap.Pop(&l.items).(*laterItem)
		delete(l.byID, it.msg.ID)
		due = append(due, it.msg)
	}
	if len(l.items) > 0 {
		wait = l.items[0].due
	}
	return due, wait
}

// run delivers each kept message again at its time, through ds, as a
// redelivery, when a message slot is free, until ctx ends: what is kept
// then stays pending for the next worker.
func (l *later) run(ctx context.Context, ds *dispatcher) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		due, next := l.next(time.Now())
		for _, msg := range due {
			if msg.Deliveries < 2 {
				msg.Deliveries = 2 // it was delivered: it has state to read
			} else {
				msg.Deliveries++
			}
			// Owned and heartbeated while it waits for a slot.
			ds.setWaiting([]stream.Message{msg}, true)
			select {
			case ds.slots <- struct{}{}:
				ds.dispatch(ctx, msg)
				ds.setWaiting([]stream.Message{msg}, false)
			case <-ctx.Done():
				ds.setWaiting([]stream.Message{msg}, false)
				return
			}
		}
		if len(due) > 0 {
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = time.Until(next)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		case <-timer.C:
		}
	}
}

// laterHeap orders kept messages by due time (container/heap).
type laterHeap []*laterItem

func (h laterHeap) Len() int           { return len(h) }
func (h laterHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h laterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *laterHeap) Push(x any) {
	it := x.(*laterItem)
	it.index = len(*h)
	*h = append(*h, it)
}
func (h *laterHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}
