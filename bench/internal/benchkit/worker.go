package benchkit

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Kinds of worker.
const (
	// KindEngine runs a relay.Engine wired as relay start wires it.
	KindEngine = "engine"
	// KindRaw runs the minimal loop: XREADGROUP COUNT Batch, then one XACK
	// of the ids it got. No matching, no state, no handler.
	KindRaw = "raw"
)

// Handlers an engine worker can run (runtime.Func, in process).
const (
	// HandlerNoop returns nil at once.
	HandlerNoop = "noop"
	// HandlerBlock blocks until the parent sends Release (or the worker
	// stops), then returns nil: it keeps invocations, and so messages, in
	// flight for memory measurements.
	HandlerBlock = "block"
	// HandlerFailEvery fails the events whose id (Event's new_image.id) is
	// a multiple of WorkerSpec.FailEvery and returns nil for the others.
	HandlerFailEvery = "fail-every"
)

// WorkerSpec configures one worker child process.
type WorkerSpec struct {
	Kind                    string
	Redis                   string
	Stream, Group, Consumer string
	// Apps is the apps root (WriteApps) of an engine worker.
	Apps string
	// Concurrency is the engine's WithConcurrency, relay start's
	// MAX_CONCURRENCY. Default 8, as in relay start.
	Concurrency int
	// Batch is the raw loop's XREADGROUP COUNT.
	Batch int
	// Handler is HandlerNoop, HandlerBlock or HandlerFailEvery.
	Handler string
	// FailEvery is the modulus of HandlerFailEvery.
	FailEvery int
	// LogFile receives the engine's log, a text log at LogLevel as relay
	// start writes to stderr; "" discards it after formatting.
	LogFile  string
	LogLevel string
	// MinPendingIdle shrinks the engine's reclaim threshold (and with it
	// the reclaim and heartbeat cadences); 0 keeps the default.
	MinPendingIdle time.Duration
	// CPUProfile, when set, is where the worker writes a CPU profile of
	// the time between Go and Stop; AllocProfile, where it writes its
	// allocations profile (pprof "allocs") at Stop.
	CPUProfile   string
	AllocProfile string
	// TraceAcks records when the worker's commands that can acknowledge a
	// message returned, for AckAt. It adds the parsing of their arguments
	// to every command: for latency at a trickle, not for throughput.
	TraceAcks bool
	// Retention is the engine's invocation state retention,
	// relay.Config.Retention: 0 keeps the default, relay.DeleteOnAck
	// deletes the state with the acknowledgement.
	Retention time.Duration
}

// Report is what a worker tells its parent, one JSON object per line.
type Report struct {
	// Event is "ready", "mem", "sample", "ackat", "stopped" or "error".
	Event string `json:"event"`
	Error string `json:"error,omitempty"`
	// Handled counts messages acknowledged (raw) or invocations that
	// returned (engine); Started counts handler calls begun (engine).
	Handled int64 `json:"handled"`
	Started int64 `json:"started"`
	// RSS and PeakRSS are the process's VmRSS and VmHWM; HeapInuse,
	// HeapAlloc and StackInuse (goroutine stacks) come from
	// runtime.MemStats after a forced GC.
	RSS        int64 `json:"rss"`
	PeakRSS    int64 `json:"peak_rss"`
	HeapInuse  int64 `json:"heap_inuse"`
	HeapAlloc  int64 `json:"heap_alloc"`
	StackInuse int64 `json:"stack_inuse"`
	Goroutines int   `json:"goroutines"`
	// CPU is the user+system CPU time used since Go; Mallocs, the heap
	// objects allocated since Go (runtime.MemStats.Mallocs).
	CPU     time.Duration `json:"cpu"`
	Mallocs uint64        `json:"mallocs"`
	// AckAt answers AckAt: the wall-clock time (Unix ns) at which the last
	// command naming the id returned, 0 when none did.
	AckAt int64 `json:"ack_at,omitempty"`
}

// workerEnv carries the JSON WorkerSpec to the child.
const workerEnv = "RELAY_BENCH_WORKER"

// IsWorker reports whether this process is a worker started by
// StartWorker. A benchmark's main checks it first and then calls only
// WorkerMain.
func IsWorker() bool { return os.Getenv(workerEnv) != "" }

// Worker is a running worker child process.
type Worker struct {
	Spec    WorkerSpec
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	reports chan Report
	exited  chan error
}

// StartWorker starts this program again as a worker with spec and waits
// until it is connected and built (its "ready"), at most a minute. The
// child dies with this process.
func StartWorker(ctx context.Context, spec WorkerSpec) (*Worker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), workerEnv+"="+string(js))
	cmd.Stderr = &prefixWriter{prefix: "worker " + spec.Consumer + ": ", w: os.Stderr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	w := &Worker{Spec: spec, cmd: cmd, stdin: stdin, reports: make(chan Report, 4), exited: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r Report
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				r = Report{Event: "error", Error: fmt.Sprintf("unreadable report %q: %v", sc.Text(), err)}
			}
			w.reports <- r
		}
		close(w.reports)
		w.exited <- cmd.Wait()
	}()
	if _, err := w.await("ready", time.Minute); err != nil {
		w.kill()
		return nil, err
	}
	return w, nil
}

// PID returns the worker's process id.
func (w *Worker) PID() int { return w.cmd.Process.Pid }

// Go starts consuming.
func (w *Worker) Go() error { return w.send("go") }

// Release lets blocked handlers (HandlerBlock) return.
func (w *Worker) Release() error { return w.send("release") }

// Mem asks the worker for its memory after a forced GC.
func (w *Worker) Mem() (Report, error) {
	if err := w.send("mem"); err != nil {
		return Report{}, err
	}
	return w.await("mem", time.Minute)
}

// Sample returns the CPU time and the allocations of the worker since Go,
// without the forced GC of Mem: what the measured work cost, taken as soon
// as it is done.
func (w *Worker) Sample() (Report, error) {
	if err := w.send("sample"); err != nil {
		return Report{}, err
	}
	return w.await("sample", time.Minute)
}

// AckAt returns when the last command of the worker that could have
// acknowledged stream entry id (XACK, or a script naming it) returned; the
// spec must set TraceAcks. ok is false when no such command was seen, nor
// returned within a second of asking.
func (w *Worker) AckAt(id string) (at time.Time, ok bool, err error) {
	if err := w.send("ackat " + id); err != nil {
		return time.Time{}, false, err
	}
	r, err := w.await("ackat", time.Minute)
	if err != nil || r.AckAt == 0 {
		return time.Time{}, false, err
	}
	return time.Unix(0, r.AckAt), true, nil
}

// Stop stops the worker gracefully (its Engine's Run returns) and returns
// its final report; the process has exited when Stop returns.
func (w *Worker) Stop() (Report, error) {
	if err := w.send("stop"); err != nil {
		w.kill()
		return Report{}, err
	}
	r, err := w.await("stopped", time.Minute)
	if err != nil {
		w.kill()
		return r, err
	}
	_ = w.stdin.Close()
	if err := <-w.exited; err != nil {
		return r, fmt.Errorf("worker %s: %w", w.Spec.Consumer, err)
	}
	return r, nil
}

// Kill ends the worker at once (SIGKILL) and waits for it; for cleanup
// after a failure.
func (w *Worker) Kill() { w.kill() }

func (w *Worker) kill() {
	_ = w.cmd.Process.Kill()
	for range w.reports {
	}
}

func (w *Worker) send(cmd string) error {
	if _, err := io.WriteString(w.stdin, cmd+"\n"); err != nil {
		return fmt.Errorf("worker %s: send %s: %w", w.Spec.Consumer, cmd, err)
	}
	return nil
}

func (w *Worker) await(event string, timeout time.Duration) (Report, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r, ok := <-w.reports:
		switch {
		case !ok:
			return Report{}, fmt.Errorf("worker %s exited before %q (see its stderr above)", w.Spec.Consumer, event)
		case r.Event == "error":
			return r, fmt.Errorf("worker %s: %s", w.Spec.Consumer, r.Error)
		case r.Event != event:
			return r, fmt.Errorf("worker %s: got %q, want %q", w.Spec.Consumer, r.Event, event)
		}
		return r, nil
	case <-t.C:
		return Report{}, fmt.Errorf("worker %s: no %q within %s", w.Spec.Consumer, event, timeout)
	}
}

// prefixWriter prefixes each line written to w.
type prefixWriter struct {
	prefix string
	w      io.Writer
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := strings.IndexByte(string(p.buf), '\n')
		if i < 0 {
			return len(b), nil
		}
		if _, err := fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i]); err != nil {
			return len(b), err
		}
		p.buf = p.buf[i+1:]
	}
}
