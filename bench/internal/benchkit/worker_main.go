package benchkit

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	goruntime "runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
	"github.com/relaydev/relay/worker"
)

// WorkerMain runs this process as the worker its parent described, serving
// the parent's commands on stdin until "stop" or end of input, then exits.
// It never returns.
func WorkerMain() {
	out := json.NewEncoder(os.Stdout)
	if err := serve(out); err != nil {
		_ = out.Encode(Report{Event: "error", Error: err.Error()})
		os.Exit(1)
	}
	os.Exit(0)
}

// serve builds the worker, reports "ready" and then answers the parent's
// commands: go, mem, release, stop.
func serve(out *json.Encoder) error {
	var spec WorkerSpec
	if err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &spec); err != nil {
		return fmt.Errorf("%s: %w", workerEnv, err)
	}
	w, err := newChild(spec)
	if err != nil {
		return err
	}
	defer w.close()
	if err := out.Encode(Report{Event: "ready"}); err != nil {
		return err
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	runErr := make(chan error, 1)
	var cpuStart time.Duration
	var mallocsStart uint64
	started := false
	in := bufio.NewScanner(os.Stdin)
commands:
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "go":
			if started {
				return errors.New("go sent twice")
			}
			started = true
			if spec.CPUProfile != "" {
				f, err := os.Create(spec.CPUProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
			}
			mallocsStart = mallocs()
			cpuStart = CPUTime()
			go func() { runErr <- w.run(ctx) }()
		case "sample":
			// CPU first: reading the allocations stops the world.
			r := Report{Event: "sample", Handled: w.handled.Load(), Started: w.begun.Load(), CPU: CPUTime() - cpuStart}
			r.Mallocs = mallocs() - mallocsStart
			if err := out.Encode(r); err != nil {
				return err
			}
		case "ackat":
			r := Report{Event: "ackat"}
			if w.tracer != nil {
				if at, ok := w.tracer.ackAt(arg, time.Second); ok {
					r.AckAt = at.UnixNano()
				}
			}
			if err := out.Encode(r); err != nil {
				return err
			}
		case "mem":
			r := w.report("mem")
			r.CPU = CPUTime() - cpuStart
			if err := out.Encode(r); err != nil {
				return err
			}
		case "release":
			w.release()
		case "stop":
			break commands
		default:
			return fmt.Errorf("unknown command %q", cmd)
		}
	}
	// stop, or the parent went away: stop gracefully either way.
	stop()
	var cpu time.Duration
	if started {
		if err := <-runErr; err != nil {
			return err
		}
		cpu = CPUTime() - cpuStart
		if spec.CPUProfile != "" {
			pprof.StopCPUProfile()
		}
	}
	n := mallocs() - mallocsStart
	if spec.AllocProfile != "" {
		if err := writeAllocProfile(spec.AllocProfile); err != nil {
			return err
		}
	}
	r := w.report("stopped")
	r.CPU, r.Mallocs = cpu, n
	return out.Encode(r)
}

// mallocs is the count of heap objects this process allocated so far.
func mallocs() uint64 {
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	return ms.Mallocs
}

func writeAllocProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// child is the worker's side: an engine or a raw loop.
type child struct {
	spec     WorkerSpec
	rc       rueidis.Client
	tracer   *ackTracer // rc when the spec sets TraceAcks
	worker   *worker.Worker
	logFile  *os.File
	handled  atomic.Int64
	begun    atomic.Int64
	released chan struct{}
	once     sync.Once
}

func newChild(spec WorkerSpec) (*child, error) {
	rc, err := Connect(spec.Redis)
	if err != nil {
		return nil, err
	}
	w := &child{spec: spec, rc: rc, released: make(chan struct{})}
	if spec.TraceAcks {
		w.tracer = newAckTracer(rc)
		w.rc = w.tracer
	}
	switch spec.Kind {
	case KindRaw:
		if spec.Batch <= 0 {
			return nil, fmt.Errorf("raw worker: batch %d must be > 0", spec.Batch)
		}
	case KindEngine:
		if err := w.buildEngine(); err != nil {
			w.close()
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown worker kind %q", spec.Kind)
	}
	return w, nil
}

// buildEngine wires an Engine as relay start does for one stream: one
// client shared by source, state, DLQ and stats, a Prometheus registry
// with the Go and process collectors, a text log at LogLevel, and the
// default timings except MinPendingIdle when the spec sets it.
func (w *child) buildEngine() error {
	apps, err := LoadApps(w.spec.Apps)
	if err != nil {
		return err
	}
	var h runtime.HandlerFunc
	switch w.spec.Handler {
	case HandlerNoop, "":
		h = func(context.Context, runtime.Request) error {
			w.begun.Add(1)
			w.handled.Add(1)
			return nil
		}
	case HandlerBlock:
		h = func(ctx context.Context, _ runtime.Request) error {
			w.begun.Add(1)
			select {
			case <-w.released:
				w.handled.Add(1)
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	case HandlerFailEvery:
		if w.spec.FailEvery <= 0 {
			return fmt.Errorf("handler %s: FailEvery %d must be > 0", HandlerFailEvery, w.spec.FailEvery)
		}
		h = func(_ context.Context, req runtime.Request) error {
			w.begun.Add(1)
			defer w.handled.Add(1)
			var ev struct {
				NewImage struct {
					ID int `json:"id"`
				} `json:"new_image"`
			}
			if err := json.Unmarshal(req.Event, &ev); err != nil {
				return err
			}
			if ev.NewImage.ID%w.spec.FailEvery == 0 {
				return fmt.Errorf("bench: event %d fails (every %d)", ev.NewImage.ID, w.spec.FailEvery)
			}
			return nil
		}
	default:
		return fmt.Errorf("unknown handler %q", w.spec.Handler)
	}
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{AppName + "/" + HandlerName: h})

	var logOut io.Writer = io.Discard
	if w.spec.LogFile != "" {
		f, err := os.OpenFile(w.spec.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("engine log: %w", err)
		}
		w.logFile, logOut = f, f
	}
	var level slog.Level
	if w.spec.LogLevel != "" {
		if err := level.UnmarshalText([]byte(w.spec.LogLevel)); err != nil {
			return fmt.Errorf("log level: %w", err)
		}
	}
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: level}))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	s := w.spec
	w.worker, err = worker.New(worker.Config{
		Redis: w.rc, Streams: []string{s.Stream}, Group: s.Group, Consumer: s.Consumer,
		Apps: worker.Static(apps), Runner: runner,
		Engine: relay.Config{
			MaxConcurrency: positiveOr(s.Concurrency, 8), Logger: log, Metrics: reg,
			ShutdownTimeout: 10 * time.Second, MinPendingIdle: s.MinPendingIdle, Retention: s.Retention,
			// As `relay start` with tracing off.
			TracerProvider: noop.NewTracerProvider(),
		},
	})
	return err
}

// positiveOr returns v when it is set (> 0), else def.
func positiveOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func (w *child) run(ctx context.Context) error {
	if w.worker != nil {
		return w.worker.Run(ctx)
	}
	return w.rawLoop(ctx)
}

// rawLoop is the physical limit of this design: one XREADGROUP of up to
// Batch new entries and one XACK of all of them per round trip pair, with
// nothing in between.
func (w *child) rawLoop(ctx context.Context) error {
	s := w.spec
	src := redisstream.New(w.rc, s.Stream, s.Group, s.Consumer)
	for ctx.Err() == nil {
		msgs, err := src.Read(ctx, s.Batch)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if len(msgs) == 0 {
			continue
		}
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		// Acked under a context of its own: a stop between the read and
		// the ack must not leave the batch pending.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err = src.Ack(actx, ids...)
		cancel()
		if err != nil {
			return err
		}
		w.handled.Add(int64(len(ids)))
	}
	return nil
}

func (w *child) release() { w.once.Do(func() { close(w.released) }) }

func (w *child) report(event string) Report {
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	mem, _ := ReadMemory(0)
	return Report{
		Event: event, Handled: w.handled.Load(), Started: w.begun.Load(),
		RSS: mem.RSS, PeakRSS: mem.PeakRSS,
		HeapInuse: int64(ms.HeapInuse), HeapAlloc: int64(ms.HeapAlloc), StackInuse: int64(ms.StackInuse),
		Goroutines: goruntime.NumGoroutine(),
	}
}

func (w *child) close() {
	w.release()
	w.rc.Close()
	if w.logFile != nil {
		_ = w.logFile.Close()
	}
}
