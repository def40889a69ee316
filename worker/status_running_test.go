package worker_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream/redisstream"
	"github.com/relaydev/relay/worker"
)

// TestStatusPublishesRunsSlotsAndLostMessages: a worker publishes the
// attempts it runs with their start and timeout, and its slots per app
// (docs/delivery.md#worker-status), so a hung handler past its timeout
// shows from any host. When Redis restarts empty, the worker publishes
// that it created the group again, and marks both attempts still running
// lost: Redis no longer has their messages pending.
func TestStatusPublishesRunsSlotsAndLostMessages(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	name := redistest.Name(t, "events")
	release := make(chan struct{})
	hang := func(context.Context, runtime.Request) error { <-release; return nil }
	cfg := fastConfig()
	cfg.Logger, cfg.StatsInterval = slog.New(slog.DiscardHandler), 20*time.Millisecond
	w, err := worker.New(worker.Config{Redis: rc, Streams: []string{name}, Group: "workers", Consumer: "w1", StateDir: t.TempDir(),
		Apps:   worker.Static(apptest.Load(t, map[string]string{"slow": "image: x\nconcurrency: 2\nevents:\n  - {handler: jobs.work, pattern: {kind: [work]}, timeout: 200ms}\n"})),
		Runner: runtime.NewFunc(map[string]runtime.HandlerFunc{"slow/jobs.work": hang}), Engine: cfg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		close(release)
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	src := redisstream.New(rc, name, "workers", "producer")
	var ids []string
	for range 3 {
		id, err := src.Publish(t.Context(), map[string]string{"event": `{"kind":"work"}`})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	var st stats.WorkerStatus
	read := func() bool {
		ws, err := redisstats.ReadStatus(t.Context(), rc, name, "workers", time.Now())
		if err != nil || len(ws) != 1 {
			return false
		}
		st = ws[0]
		return true
	}
	testutil.WaitFor(t, 10*time.Second, "two attempts past their timeout", func() bool {
		return read() && len(st.Running) == 2 && st.Running[1].PastTimeout(time.Now())
	})
	// Any two of the three messages run: the deliveries race for the slots.
	if st.Running[0].MessageID == st.Running[1].MessageID {
		t.Errorf("both runs are of message %s", st.Running[0].MessageID)
	}
	for i, r := range st.Running {
		if r.App != "slow" || r.Handler != "jobs.work" || !slices.Contains(ids, r.MessageID) || r.Attempt != 1 || r.MaxAttempts != 5 ||
			r.Timeout() != 200*time.Millisecond || r.Lost || r.LeaseUntil.IsZero() {
			t.Errorf("run %d = %+v, want slow/jobs.work of one of %v, attempt 1 of 5, timeout 200ms, not lost", i, r, ids)
		}
	}
	if a, ok := st.Slots.App("slow"); !ok || a != (stats.AppSlots{App: "slow", InUse: 2, Limit: 2}) || st.Slots.InUse != 2 || st.Slots.Max != relay.DefaultConcurrency {
		t.Errorf("slots = %+v, want slow 2 of 2, 2 of %d in all", st.Slots, relay.DefaultConcurrency)
	}
	if st.GroupRecreations != 0 {
		t.Errorf("group recreated %d times before any loss", st.GroupRecreations)
	}
	stalls := stats.Stalls([]stats.WorkerStatus{st}, 3, time.Now())
	if len(stalls) != 3 || stalls[0].Kind != stats.StallPastTimeout || stalls[2].Kind != stats.StallSlotsFull || stalls[2].Waiting != 1 {
		t.Errorf("stalls = %+v, want two attempts past their timeout and slow's slots full with 1 message waiting", stalls)
	}

	srv.Stop()
	srv.Restart(t)
	testutil.WaitFor(t, 10*time.Second, "the group recreated and both attempts lost", func() bool {
		return read() && st.GroupRecreations == 1 && len(st.Running) == 2 && st.Running[0].Lost && st.Running[1].Lost
	})
	if time.Since(st.GroupRecreatedAt) > time.Minute {
		t.Errorf("group recreated at %v", st.GroupRecreatedAt)
	}
	if a, _ := st.Slots.App("slow"); a.InUse != 2 {
		t.Errorf("the lost attempts hold %d slots, want 2", a.InUse)
	}
}
