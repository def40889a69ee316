package combine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// gate is a RunFunc whose batches block until released, recording each
// batch's items.
type gate struct {
	mu      sync.Mutex
	batches [][]int
	started chan []int
	release chan struct{}
}

func newGate() *gate {
	return &gate{started: make(chan []int, 100), release: make(chan struct{})}
}

func (g *gate) run(ctx context.Context, group string, items []int) []Result[string] {
	g.mu.Lock()
	g.batches = append(g.batches, items)
	g.mu.Unlock()
	g.started <- items
	<-g.release
	out := make([]Result[string], len(items))
	for i, it := range items {
		out[i].Value = fmt.Sprintf("%s:%d", group, it)
	}
	return out
}

type call struct {
	v   string
	err error
}

func doAsync(c *Combiner[string, int, string], ctx context.Context, group string, item int) <-chan call {
	ch := make(chan call, 1)
	go func() {
		v, err := c.Do(ctx, group, item)
		ch <- call{v, err}
	}()
	return ch
}

// waitQueued waits until group has n calls waiting behind its batch of one
// in flight.
func waitQueued(t *testing.T, c *Combiner[string, int, string], group string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c.Pending(group) == n+1 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("group %s: %d calls never queued", group, n)
}

func TestIdleGroupRunsACallAlone(t *testing.T) {
	g := newGate()
	close(g.release)
	c := New(8, g.run)
	v, err := c.Do(context.Background(), "a", 7)
	if err != nil || v != "a:7" {
		t.Fatalf("Do = %q, %v; want a:7", v, err)
	}
	if len(g.batches) != 1 || len(g.batches[0]) != 1 {
		t.Fatalf("batches %v, want one of one item", g.batches)
	}
	if len(c.groups) != 0 {
		t.Fatalf("idle group still tracked: %v", c.groups)
	}
}

func TestCallsQueuedBehindABatchRunAsTheNextBatch(t *testing.T) {
	g := newGate()
	c := New(3, g.run)
	first := doAsync(c, context.Background(), "a", 0)
	<-g.started
	var rest []<-chan call
	for i := 1; i <= 5; i++ {
		rest = append(rest, doAsync(c, context.Background(), "a", i))
		waitQueued(t, c, "a", i) // queue in a known order
	}
	close(g.release)
	if r := <-first; r.v != "a:0" || r.err != nil {
		t.Fatalf("first call = %+v", r)
	}
	for i, ch := range rest {
		if r := <-ch; r.v != fmt.Sprintf("a:%d", i+1) || r.err != nil {
			t.Fatalf("call %d = %+v", i+1, r)
		}
	}
	want := "[[0] [1 2 3] [4 5]]"
	if got := fmt.Sprint(g.batches); got != want {
		t.Fatalf("batches %s, want %s (limit 3, FIFO)", got, want)
	}
}

func TestGroupsDoNotWaitForEachOther(t *testing.T) {
	g := newGate()
	c := New(8, g.run)
	a := doAsync(c, context.Background(), "a", 1)
	<-g.started
	b := doAsync(c, context.Background(), "b", 2)
	select {
	case items := <-g.started:
		if fmt.Sprint(items) != "[2]" {
			t.Fatalf("group b ran %v", items)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("group b waited for group a's batch")
	}
	close(g.release)
	if r := <-a; r.v != "a:1" {
		t.Fatalf("a = %+v", r)
	}
	if r := <-b; r.v != "b:2" {
		t.Fatalf("b = %+v", r)
	}
}

func TestCancelledWaitingCallDoesNotRun(t *testing.T) {
	g := newGate()
	c := New(8, g.run)
	first := doAsync(c, context.Background(), "a", 0)
	<-g.started
	ctx, cancel := context.WithCancel(context.Background())
	gone := doAsync(c, ctx, "a", 1)
	waitQueued(t, c, "a", 1)
	kept := doAsync(c, context.Background(), "a", 2)
	waitQueued(t, c, "a", 2)
	cancel()
	if r := <-gone; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled call = %+v, want context.Canceled", r)
	}
	close(g.release)
	<-first
	if r := <-kept; r.v != "a:2" || r.err != nil {
		t.Fatalf("kept call = %+v", r)
	}
	if got := fmt.Sprint(g.batches); got != "[[0] [2]]" {
		t.Fatalf("batches %s: the cancelled item ran", got)
	}
}

// A call made the leader after its context ended still runs the batch, so
// the calls behind it are not stranded.
func TestCancelledLeaderStillServesTheGroup(t *testing.T) {
	g := newGate()
	c := New(1, g.run)
	first := doAsync(c, context.Background(), "a", 0)
	<-g.started
	ctx, cancel := context.WithCancel(context.Background())
	next := doAsync(c, ctx, "a", 1)
	waitQueued(t, c, "a", 1)
	behind := doAsync(c, context.Background(), "a", 2)
	waitQueued(t, c, "a", 2)
	// Hand the group to item 1, then cancel it while its batch runs.
	g.release <- struct{}{}
	<-first
	<-g.started
	cancel()
	close(g.release)
	if r := <-next; r.v != "a:1" && !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled leader = %+v", r)
	}
	select {
	case r := <-behind:
		if r.v != "a:2" || r.err != nil {
			t.Fatalf("call behind the leader = %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("call behind a cancelled leader stranded")
	}
}

func TestBatchContextKeepsTheLatestDeadlineAndNoCancellation(t *testing.T) {
	var got []time.Time
	var cancelled []bool
	hold := make(chan struct{})
	started := make(chan struct{}, 10)
	c := New(8, func(ctx context.Context, group string, items []int) []Result[string] {
		d, _ := ctx.Deadline()
		got = append(got, d)
		started <- struct{}{}
		if items[0] == 0 {
			<-hold
		}
		cancelled = append(cancelled, ctx.Err() != nil)
		return make([]Result[string], len(items))
	})
	first := doAsync(c, context.Background(), "a", 0)
	<-started
	near, cancelNear := context.WithTimeout(context.Background(), time.Hour)
	far, cancelFar := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancelFar()
	a := doAsync(c, near, "a", 1)
	waitQueued(t, c, "a", 1)
	b := doAsync(c, far, "a", 2)
	waitQueued(t, c, "a", 2)
	close(hold)
	<-first
	<-a
	<-b
	cancelNear()
	if len(got) != 2 {
		t.Fatalf("%d batches, want 2", len(got))
	}
	if !got[0].IsZero() {
		t.Errorf("batch of a call without deadline has deadline %v", got[0])
	}
	farDeadline, _ := far.Deadline()
	if !got[1].Equal(farDeadline) {
		t.Errorf("batch deadline %v, want the latest call's %v", got[1], farDeadline)
	}
	if cancelled[1] {
		t.Error("batch context was cancelled")
	}
}

func TestShortRunFailsTheItemsWithoutResult(t *testing.T) {
	c := New(8, func(ctx context.Context, group string, items []int) []Result[string] { return nil })
	if _, err := c.Do(context.Background(), "a", 1); !errors.Is(err, errShortRun) {
		t.Fatalf("err = %v, want errShortRun", err)
	}
}

// Every call gets its own item's result under heavy concurrency.
func TestConcurrentCallsGetTheirOwnResults(t *testing.T) {
	var mu sync.Mutex
	maxBatch := 0
	c := New(16, func(ctx context.Context, group string, items []int) []Result[string] {
		mu.Lock()
		maxBatch = max(maxBatch, len(items))
		mu.Unlock()
		time.Sleep(100 * time.Microsecond)
		out := make([]Result[string], len(items))
		for i, it := range items {
			out[i].Value = fmt.Sprintf("%s:%d", group, it)
		}
		return out
	})
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			group := fmt.Sprint("g", w%3)
			for i := range 50 {
				item := w*1000 + i
				v, err := c.Do(context.Background(), group, item)
				if want := fmt.Sprintf("%s:%d", group, item); v != want || err != nil {
					t.Errorf("Do(%s, %d) = %q, %v; want %q", group, item, v, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
	if maxBatch > 16 {
		t.Fatalf("a batch had %d items, limit 16", maxBatch)
	}
	if len(c.groups) != 0 {
		t.Fatalf("groups left tracked: %d", len(c.groups))
	}
}
