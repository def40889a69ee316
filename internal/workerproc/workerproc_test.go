package workerproc

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/testutil"
)

const consumerVar = "WORKERPROC_TEST_WORKER"

// TestWorkerProcess is not a test: TestSet's workers run it. It logs as an
// engine does once it runs and waits for SIGTERM; consumer "crash" exits
// by itself instead.
func TestWorkerProcess(t *testing.T) {
	consumer, ctx := Worker(t, consumerVar)
	fmt.Fprintf(os.Stderr, "level=INFO %s consumer=%s extra=%s\n", startedLine, consumer, os.Getenv("WORKERPROC_TEST_EXTRA"))
	if consumer == "crash" {
		os.Exit(3)
	}
	<-ctx.Done()
}

// recorder is a testing.TB that keeps its errors instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (e *recorder) Error(args ...any) { e.errs = append(e.errs, fmt.Sprint(args...)) }

func TestSet(t *testing.T) {
	rec := &recorder{TB: t}
	s := New(rec, Config{ConsumerVar: consumerVar, Env: []string{"WORKERPROC_TEST_EXTRA=shared"}})
	s.Start("a")
	s.StartAs("b", "twin", "WORKERPROC_TEST_EXTRA=own")
	s.WaitStarted("a", "b")
	s.WaitStarted()
	b := s.Proc("b")
	if b == nil || s.NameOf(b.Pid()) != "b" || s.Pid("b") != b.Pid() {
		t.Fatalf("worker b: %+v, NameOf its pid %q", b, s.NameOf(s.Pid("b")))
	}
	if n := s.Count("consumer=twin extra=own"); n != 1 {
		t.Errorf("b's consumer and env logged %d times, want once", n)
	}
	if n := s.Count("consumer=a extra=shared"); n != 1 {
		t.Errorf("a's consumer and env logged %d times, want once", n)
	}
	if !s.Signal("a", syscall.SIGTERM) || s.Signal("a", syscall.SIGTERM) {
		t.Error("Signal: want true for the running worker, then false")
	}
	if s.Started("a") || s.Pid("a") != 0 {
		t.Error("a still counts as running after its stop")
	}
	s.Start("crash")
	testutil.WaitFor(t, time.Minute, "the crash noticed", func() bool { return s.Proc("crash") == nil })
	s.CheckCrashes()
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "worker crash exited by itself (exit status 3)") || !strings.Contains(rec.errs[0], "consumer=crash") {
		t.Errorf("crashes reported: %q, want the one of worker crash with its log's tail", rec.errs)
	}
	if len(s.Logs()) != 3 {
		t.Errorf("logs %v, want one per start", s.Logs())
	}
	s.SignalAll(syscall.SIGKILL)
	if names := s.Names(); len(names) != 0 {
		t.Errorf("running after SignalAll: %v", names)
	}
	s.CheckCrashes()
	if len(rec.errs) != 1 {
		t.Errorf("a killed worker reported as a crash: %q", rec.errs[1:])
	}
}
