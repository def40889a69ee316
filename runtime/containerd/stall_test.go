package containerd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"google.golang.org/grpc"

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
	// The first attempt's removal, in the background, is done before the
	// stall: one that outlasted the cleanup timeout would leave its
	// container to the next sweep.
	testutil.WaitFor(t, 20*time.Second, "the first attempt's container removed", func() bool {
		cs, err := f.client.Containers(ctx)
		return err == nil && len(cs) == 2
	})
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
	// containerd stays stalled until the cancelled attempt returns: one
	// that waited for containerd would not return before the bound, however
	// slow a busy machine is to run it.
	select {
	case err := <-cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("attempt cancelled during the stall: %v, want its cancellation", err)
		}
		t.Logf("the cancelled attempt returned %v after its cancellation", time.Since(paused)-stall/3)
	case <-time.After(cancelBound):
		t.Errorf("an attempt cancelled during the stall did not return within %v, while containerd stayed stalled; goroutines:\n%s",
			cancelBound, goroutineStacks())
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

// cancelBound is how long a cancelled attempt may take to return while
// containerd does not answer: long enough for the busiest test machine, too
// short for one that waits for containerd, which stays stalled meanwhile.
const cancelBound = 30 * time.Second

// TestRunCancelledDuringCreation cancels an attempt while containerd
// creates its container, or its task, and holds containerd's answers from
// then on: the attempt returns its cancellation without waiting for them,
// and what the creation left is removed once containerd answers again
// (before Close returns).
func TestRunCancelledDuringCreation(t *testing.T) {
	t.Parallel()
	for _, method := range []string{".Containers/Create", ".Tasks/Create"} {
		t.Run(method[1:], func(t *testing.T) {
			t.Parallel()
			testRunCancelledDuring(t, method)
		})
	}
}

// testRunCancelledDuring is TestRunCancelledDuringCreation with the
// creation whose gRPC method ends in method.
func testRunCancelledDuring(t *testing.T, method string) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var held atomic.Bool
	release := make(chan struct{})
	stalled := grpc.WithChainUnaryInterceptor(func(callCtx context.Context, called string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if held.Load() {
			select {
			case <-release:
			case <-callCtx.Done():
				return callCtx.Err()
			}
		}
		err := invoker(callCtx, called, req, reply, cc, opts...)
		if strings.HasSuffix(called, method) && err == nil {
			// Created, but the answer comes too late: the attempt is
			// cancelled first, and containerd answers nothing more.
			held.Store(true)
			cancel()
			<-callCtx.Done()
			return callCtx.Err()
		}
		return err
	})
	c, err := client.New(os.Getenv(containerdtest.EnvAddress), client.WithDefaultNamespace(f.client.DefaultNamespace()),
		client.WithExtraDialOpts([]grpc.DialOption{stalled}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	clean := f.client
	f.client = c
	r := f.newRunner(t, "cancelled-"+randomHex(4))
	f.client = clean

	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, f.request("events.created"))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want its cancellation", err)
		}
		if !held.Load() {
			t.Fatalf("the attempt was cancelled before a call to %s", method)
		}
	case <-time.After(cancelBound):
		t.Error("the cancelled attempt waited for containerd")
		close(release)
		<-done
		return
	}
	close(release)
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, clean)
}

// goroutineStacks returns the stacks of every goroutine, to show what a
// call that did not return waits for.
func goroutineStacks() string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	return b.String()
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
