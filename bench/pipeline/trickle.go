package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/bench/internal/benchkit"
	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/stream/redisstream"
)

// trickleWarmup events of each pipeline are not counted: the first
// connections' buffers, the scripts' first load.
const trickleWarmup = 3

// tricklePipe is one pipeline of the trickle: its stream, its one worker
// and the latencies measured.
type tricklePipe struct {
	mode, retention string
	name            string
	w               *benchkit.Worker
	lat             []time.Duration
}

// trickle measures publish → acknowledgement latency at a trickle: a raw
// worker and an engine worker (retention: the first of -retentions), on
// streams of their own and idle in their blocking reads, are sent one
// event each every trickleInterval, the engine's half an interval after
// the raw loop's, so that both see the same machine and neither's event
// meets the other's. A message's latency runs from just before its XADD
// to the return, in the worker, of the command that acknowledged it
// (benchkit.WorkerSpec.TraceAcks: XACK, or the settle script): no polling
// adds to it; the measuring loop polls only to know when to ask the worker.
func trickle(ctx context.Context, cfg config, admin rueidis.Client, base string) error {
	ret := cfg.retentions[0]
	pipes := []*tricklePipe{
		{mode: benchkit.KindRaw, retention: "-", name: base + "-raw"},
		{mode: benchkit.KindEngine, retention: ret.text, name: base + "-engine"},
	}
	defer func() {
		for _, p := range pipes {
			if p.w != nil {
				p.w.Kill()
			}
			cleanup(context.WithoutCancel(ctx), admin, p.name)
		}
	}()
	for _, p := range pipes {
		if err := redisstream.New(admin, p.name, group, "bench").EnsureGroup(ctx); err != nil {
			return err
		}
		spec := benchkit.WorkerSpec{
			Kind: p.mode, Redis: cfg.redis, Stream: p.name, Group: group, Consumer: "w1",
			Apps: cfg.apps, Concurrency: cfg.concurrency, Batch: cfg.batch, Handler: benchkit.HandlerNoop,
			LogFile: filepath.Join(cfg.dir, p.name+"-w1.log"), LogLevel: cfg.logLevel,
			Retention: ret.d, TraceAcks: true,
		}
		w, err := benchkit.StartWorker(ctx, spec)
		if err != nil {
			return err
		}
		p.w = w
		if err := w.Go(); err != nil {
			return err
		}
	}
	load := benchkit.LoadAverage()
	fmt.Fprintf(os.Stderr, "pipeline: trickle, %d+%d events per pipeline, one every %s (about %s)\n",
		trickleWarmup, cfg.trickle, cfg.trickleInterval, (time.Duration(trickleWarmup+cfg.trickle) * cfg.trickleInterval).Round(time.Second))
	half := cfg.trickleInterval / 2
	next := time.Now().Add(half)
	for i := range trickleWarmup + cfg.trickle {
		for _, p := range pipes {
			if !ctxtime.Sleep(ctx, time.Until(next)) {
				return ctx.Err()
			}
			next = next.Add(half)
			d, err := publishAwaitAck(ctx, admin, p, i)
			if err != nil {
				return fmt.Errorf("trickle, %s: event %d: %w", p.mode, i, err)
			}
			if i >= trickleWarmup {
				p.lat = append(p.lat, d)
			}
		}
	}
	for _, p := range pipes {
		if _, err := p.w.Stop(); err != nil {
			return err
		}
		p.w = nil
	}
	t := benchkit.Table{
		Title: fmt.Sprintf("latency at a trickle, publish (XADD) → acknowledged (XACK returned in the worker), ms: one event every %s per pipeline, %d each after %d warm-up; load %.2f",
			cfg.trickleInterval, cfg.trickle, trickleWarmup, load),
		Header: []string{"MODE", "WORKERS", "RETENTION", "EVENTS", "P50", "P90", "P99", "MAX", "MEAN", "P50 × RAW"},
	}
	var rawP50 time.Duration
	for _, p := range pipes {
		s := benchkit.Summarize(p.lat)
		x := "-"
		if p.mode == benchkit.KindRaw {
			rawP50 = s.P50
		} else if rawP50 > 0 {
			x = fmt.Sprintf("%.1f", float64(s.P50)/float64(rawP50))
		}
		t.Add(p.mode, 1, p.retention, s.N, benchkit.Ms(s.P50), benchkit.Ms(s.P90), benchkit.Ms(s.P99), benchkit.Ms(s.Max), benchkit.Ms(s.Mean), x)
	}
	if err := t.Print(os.Stdout); err != nil {
		return err
	}
	if cfg.trickle < 100 {
		fmt.Printf("(With fewer than 100 events, P99 is the slowest: nearest rank.)\n")
	}
	return nil
}

// publishAwaitAck appends event i to p's stream and returns how long after
// the XADD was sent the worker's acknowledgement of it returned.
func publishAwaitAck(ctx context.Context, admin rueidis.Client, p *tricklePipe, i int) (time.Duration, error) {
	start := time.Now()
	id, err := admin.Do(ctx, admin.B().Xadd().Key(p.name).Id("*").FieldValue().FieldValue("event", benchkit.Event(i)).Build()).ToString()
	if err != nil {
		return 0, fmt.Errorf("xadd: %w", err)
	}
	for {
		done, err := benchkit.Settled(ctx, admin, p.name, group, id)
		if err != nil {
			return 0, err
		}
		if done {
			break
		}
		if time.Since(start) > 10*time.Second {
			return 0, fmt.Errorf("%s not acknowledged within 10s", id)
		}
		if !ctxtime.Sleep(ctx, 500*time.Microsecond) {
			return 0, ctx.Err()
		}
	}
	seen := time.Now()
	at, ok, err := p.w.AckAt(id)
	switch {
	case err != nil:
		return 0, err
	case !ok:
		return 0, fmt.Errorf("the worker saw no acknowledgement of %s", id)
	case at.Before(start) || at.After(seen.Add(time.Second)):
		// The reply may reach the worker after the poll that found the
		// message acknowledged, but not long after.
		return 0, fmt.Errorf("the worker's acknowledgement of %s is at %s, outside the publish (%s) and a second after the poll that found it (%s)",
			id, at.Format(time.StampMicro), start.Format(time.StampMicro), seen.Format(time.StampMicro))
	}
	return at.Sub(start), nil
}
