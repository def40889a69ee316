package relay

import (
	"context"
	"errors"
	"testing"
	"time"
)

type ctxKey struct{}

// TestSharedDeadlines: a write's context has its delivery's values, ends
// within the slack after its own deadline and not before, survives the
// cancellation of its delivery's context, and ends with its parent.
func TestSharedDeadlines(t *testing.T) {
	var s sharedDeadlines
	delivery, cancelDelivery := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "m1"))
	end := time.Now().Add(time.Hour)
	slack := 10 * time.Millisecond
	ctx := s.with(delivery, context.Background(), end, slack)
	if got := ctx.Value(ctxKey{}); got != "m1" {
		t.Errorf("Value = %v, want the delivery's value m1", got)
	}
	check := func(ctx context.Context, end time.Time) {
		t.Helper()
		d, ok := ctx.Deadline()
		if !ok || d.Before(end) || d.After(end.Add(slack)) {
			t.Errorf("Deadline = %v, %v; want within [%v, %v]", d, ok, end, end.Add(slack))
		}
	}
	check(ctx, end)
	// A later write within the slack shares it; one past it gets its own.
	check(s.with(delivery, context.Background(), end.Add(slack/2), slack), end.Add(slack/2))
	check(s.with(delivery, context.Background(), end.Add(time.Second), slack), end.Add(time.Second))
	check(s.with(delivery, context.Background(), end.Add(-time.Second), slack), end.Add(-time.Second))

	cancelDelivery()
	if err := ctx.Err(); err != nil {
		t.Fatalf("Err after the delivery's context was cancelled = %v, want nil", err)
	}
	if err := context.Cause(ctx); err != nil {
		t.Errorf("Cause after the delivery's context was cancelled = %v, want nil", err)
	}

	parent, stop := context.WithCancel(context.Background())
	ctx = s.with(delivery, parent, end, slack)
	// Derived contexts and AfterFunc follow it without a goroutine of their own.
	child, cancelChild := context.WithCancel(ctx)
	defer cancelChild()
	fired := make(chan struct{})
	context.AfterFunc(ctx, func() { close(fired) })
	stop()
	<-ctx.Done()
	<-child.Done()
	<-fired
	if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(context.Cause(ctx), context.Canceled) {
		t.Errorf("Err, Cause after the parent stopped = %v, %v; want context.Canceled", ctx.Err(), context.Cause(ctx))
	}

	ctx = s.with(delivery, context.Background(), time.Now().Add(20*time.Millisecond), slack)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a write's context did not end at its deadline")
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Errorf("Err at the deadline = %v, want context.DeadlineExceeded", ctx.Err())
	}
}
