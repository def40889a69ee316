package containerd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime/containerd"
)

// envStall sets how long TestContainerdStalled stalls containerd (a
// duration; default 3s). The fault as reported lasted 60s:
// RELAY_TEST_CONTAINERD_STALL=60s runs that.
const envStall = "RELAY_TEST_CONTAINERD_STALL"

// stallScript reports a container used twice (its /tmp holds the mark of
// an earlier attempt) and names the attempt.
const stallScript = `[ -e /tmp/mark ] && echo "reused /tmp"; touch /tmp/mark; echo "ran $RELAY_MESSAGE_ID"`

// TestContainerdStalled stalls a private containerd (SIGSTOP) while a
// Runner with prepared containers and tasks created ahead serves attempts,
// then continues it (docs/operations.md "Faults"). Attempts started during
// the stall wait for containerd, without a deadline of their own, and
// succeed once it answers, each in a container of its own (two of them
// prepared ones); an attempt whose context is cancelled during the stall
// returns its cancellation without waiting for containerd; a new attempt
// afterwards runs as usual; no goroutine, no connection to containerd and
// nothing in the namespace is left over.
func TestContainerdStalled(t *testing.T) {
	stall := 3 * time.Second
	if v := os.Getenv(envStall); v != "" {
		var err error
		if stall, err = time.ParseDuration(v); err != nil {
			t.Fatalf("%s=%q: %v", envStall, v, err)
		}
	}
	d := containerdtest.Private(t)
	f := newFixture(t)
	r := f.newRunner(t, "stall-"+randomHex(4), containerd.WithPreparedContainers(2))
	req := f.request("jobs.stall")
	req.Spec.Command = []string{"/bin/sh", "-c", stallScript}
	req.Timeout = 10 * time.Second
	ctx := t.Context()
	run := func(ctx context.Context, id string) <-chan error {
		done := make(chan error, 1)
		go func() {
			req := req
			req.MessageID = id
			_, err := r.Run(ctx, req)
			done <- err
		}()
		return done
	}
	if err := <-run(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	waitPreTasks(t, r, f.client, 2)
	goroutines, sockets := settledGoroutines(), socketFDs(t)

	d.Pause()
	paused := time.Now()
	ids := []string{"s1", "s2", "s3", "s4"}
	var runs []<-chan error
	for _, id := range ids {
		runs = append(runs, run(ctx, id))
	}
	cctx, cancel := context.WithCancel(ctx)
	cancelled := run(cctx, "cancelled")
	time.Sleep(stall / 3)
	cancel()
	select {
	case err := <-cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("attempt cancelled during the stall: %v, want its cancellation", err)
		}
		t.Logf("the cancelled attempt returned %v after its cancellation", time.Since(paused)-stall/3)
	case <-time.After(stall / 3):
		t.Errorf("an attempt cancelled during the stall did not return within %v", stall/3)
	}
	time.Sleep(time.Until(paused.Add(stall)))
	for i, done := range runs {
		select {
		case err := <-done:
			t.Errorf("attempt %s returned during the stall: %v", ids[i], err)
		default:
		}
	}
	d.Resume()
	resumed := time.Now()
	for i, done := range runs {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("attempt %s after the stall: %v", ids[i], err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("attempt %s did not return within a minute of the stall's end", ids[i])
		}
	}
	t.Logf("the attempts started during a %v stall finished %v after it", stall, time.Since(resumed))
	if err := <-run(ctx, "after"); err != nil {
		t.Fatalf("an attempt after the stall: %v", err)
	}
	out := f.stdout.String()
	if strings.Contains(out, "reused") {
		t.Errorf("a container served two attempts:\n%s", out)
	}
	for _, id := range append(ids, "after") {
		if n := strings.Count(out, "ran "+id+"\n"); n != 1 {
			t.Errorf("attempt %s ran %d times:\n%s", id, n, out)
		}
	}

	// Back to where it was before the stall: two prepared containers, and
	// as many goroutines and connections.
	waitPreTasks(t, r, f.client, 2)
	testutil.WaitFor(t, 30*time.Second, fmt.Sprintf("at most %d goroutines, as before the stall", goroutines), func() bool {
		return settledGoroutines() <= goroutines
	})
	if n := socketFDs(t); n > sockets {
		t.Errorf("%d sockets open after the stall, %d before", n, sockets)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

// settledGoroutines counts the goroutines, with a moment for those that
// are ending.
func settledGoroutines() int {
	time.Sleep(100 * time.Millisecond)
	return goruntime.NumGoroutine()
}

// socketFDs counts the process's open sockets.
func socketFDs(t *testing.T) int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}
