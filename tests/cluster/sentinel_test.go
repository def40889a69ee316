package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaydev/relay/app/template"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/internal/topology"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

const failoverApp = `
image: unused
concurrency: 8
events:
  - {handler: ok.run, pattern: {kind: [ok]}, timeout: 5s}
`

// failoverConfig shrinks the Engine's timings so that whatever a failover
// leaves pending is reclaimed within a second, not a minute.
func failoverConfig(log *slog.Logger) relay.Config {
	return relay.Config{
		MinPendingIdle:    500 * time.Millisecond,
		ReclaimInterval:   100 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond,
		Backoff:           []time.Duration{50 * time.Millisecond},
		LeaseGrace:        300 * time.Millisecond,
		ConcurrencyWait:   time.Second,
		ShutdownTimeout:   time.Second,
		Logger:            log,
	}
}

// errUnconfirmed: an XADD the replica did not acknowledge in time, which a
// failover may legitimately lose; the publisher then publishes again.
var errUnconfirmed = errors.New("not confirmed by a replica")

// TestSentinelFailover kills the master of a Sentinel-managed Redis
// (scripts/sentinel.sh) while two workers consume and a publisher writes,
// then checks the ledger: every event whose publication a replica
// confirmed (XADD then WAIT 1 on the same connection) ran its handler at
// least once and every stream entry was acknowledged, so nothing was lost;
// runs beyond one per event are counted as the at-least-once cost.
func TestSentinelFailover(t *testing.T) {
	s := topology.NewSentinel(t, topology.SentinelOptions{DownAfter: time.Second})
	ctx := context.Background()
	const (
		streamName = "events"
		group      = "relay"
		events     = 400
		killAt     = 150
	)
	apps, err := template.LoadDir(writeApp(t, "app", failoverApp, map[string]string{}))
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	runs := map[int]int{} // event number -> successful handler runs
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"app/ok.run": func(ctx context.Context, req runtime.Request) error {
			var ev struct{ N int }
			if err := json.Unmarshal(req.Event, &ev); err != nil {
				return err
			}
			// Keep invocations in flight across the kill.
			time.Sleep(time.Duration(2+rand.IntN(10)) * time.Millisecond)
			mu.Lock()
			runs[ev.N]++
			mu.Unlock()
			return nil
		},
	})

	logs := &testutil.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker logs:\n%s", logs)
		}
	})
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	var workers sync.WaitGroup
	for _, consumer := range []string{"w1", "w2"} {
		rc := topology.Connect(t, s.ClientOption())
		e, err := relay.NewEngine(apps, relay.Components{
			Source: redisstream.New(rc, streamName, group, consumer, redisstream.WithBlock(100*time.Millisecond)),
			State:  redisstate.New(rc), Runner: runner,
			Stream: streamName, Group: group, Consumer: consumer,
		}, failoverConfig(log.With(slog.String("consumer", consumer))))
		if err != nil {
			t.Fatal(err)
		}
		workers.Go(func() {
			if err := e.Run(wctx); err != nil {
				t.Errorf("worker %s: %v", consumer, err)
			}
		})
	}

	// The publisher confirms each event with WAIT 1 on the connection that
	// wrote it, and publishes it again until confirmed.
	pub := topology.Connect(t, s.ClientOption())
	publish := func(n int) (string, error) {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var id string
		err := pub.Dedicated(func(dc rueidis.DedicatedClient) error {
			res := dc.DoMulti(pctx,
				dc.B().Xadd().Key(streamName).Id("*").FieldValue().FieldValue("event", fmt.Sprintf(`{"kind":"ok","n":%d}`, n)).Build(),
				dc.B().Wait().Numreplicas(1).Timeout(2000).Build())
			var err error
			if id, err = res[0].ToString(); err != nil {
				return err
			}
			if acks, err := res[1].AsInt64(); err != nil || acks < 1 {
				return fmt.Errorf("%s: %w (%v)", id, errUnconfirmed, err)
			}
			return nil
		})
		return id, err
	}
	var (
		confirmed   = map[int]string{} // event number -> confirmed entry id
		republished int
		killedAt    time.Time
		recovered   time.Duration
		killed      atomic.Bool
	)
	var oldMaster string
	for n := range events {
		if n == killAt {
			oldMaster, err = s.KillMaster(ctx)
			if err != nil {
				t.Fatal(err)
			}
			killedAt = time.Now()
			killed.Store(true)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			id, err := publish(n)
			if err == nil {
				confirmed[n] = id
				if killed.Load() && recovered == 0 {
					recovered = time.Since(killedAt)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("event %d not confirmed within a minute: %v", n, err)
			}
			republished++
			// After the failover the promoted replica has no replica of its
			// own until the old master is back: start it again (it rejoins
			// as a replica), as an operator would.
			if killed.Load() {
				if m, err := s.Master(ctx); err == nil && m != oldMaster {
					if err := s.Restart(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	check := topology.Connect(t, s.ClientOption())
	var last string
	for _, id := range confirmed {
		if stream.CompareID(id, last) > 0 {
			last = id
		}
	}
	testutil.WaitFor(t, 2*time.Minute, "every confirmed event handled and every entry acknowledged", func() bool {
		mu.Lock()
		done := true
		for n := range confirmed {
			done = done && runs[n] > 0
		}
		mu.Unlock()
		return done && redistest.Settled(ctx, check, streamName, group, last)
	})
	stopWorkers()
	workers.Wait()
	// The workers saw the failover: without errors the kill missed them.
	if !strings.Contains(logs.String(), "level=WARN") && !strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("the workers logged no Redis trouble; did the failover happen under them?")
	}

	entries, err := check.Do(ctx, check.B().Xlen().Key(streamName).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	dlqLen, err := redisdlq.NewStore(check, streamName).Len(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var lost, totalRuns int
	for n := range confirmed {
		if runs[n] == 0 {
			lost++
		}
	}
	for _, r := range runs {
		totalRuns += r
	}
	if lost != 0 || len(confirmed) != events || dlqLen != 0 {
		t.Errorf("lost %d of %d confirmed events (of %d published); %d DLQ entries", lost, len(confirmed), events, dlqLen)
	}
	t.Logf("sentinel failover: master %s killed after %d events; publishing confirmed again after %s; %d events published and confirmed (%d publish attempts repeated), %d stream entries, all acknowledged; lost %d; %d handler runs, %d duplicate runs",
		oldMaster, killAt, recovered.Round(time.Millisecond), len(confirmed), republished, entries, lost, totalRuns, totalRuns-len(confirmed))
}
