package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/matcher/yamlpattern"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream/redisstream"
)

// statsApp: ok.run succeeds, flaky.run fails its first attempt and is
// retried once, bad.run fails and is dead-lettered at once.
const statsApp = `
image: relay.local/busybox:latest
events:
  - handler: ok.run
    pattern: {kind: [ok]}
  - handler: flaky.run
    pattern: {kind: [flaky]}
    retries: 1
  - handler: bad.run
    pattern: {kind: [bad]}
    retries: 0
`

// statsWorker runs one Engine of h as consumer, with its own metrics
// registry and stats written through statsClient, until stop is called or
// the test ends.
func statsWorker(h *harness, consumer string, statsClient rueidis.Client) (reg *prometheus.Registry, stop func()) {
	h.t.Helper()
	reg = prometheus.NewRegistry()
	cfg := fastConfig()
	cfg.Metrics, cfg.Stats, cfg.StatsInterval = reg, redisstats.NewRecorder(statsClient, h.stream, h.group), 20*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e, err := relay.NewEngine(h.apps, relay.Components{
		Source: redisstream.New(h.rc, h.stream, h.group, consumer, redisstream.WithBlock(50*time.Millisecond)),
		State:  h.state, Runner: runtime.NewFunc(h.handlers),
		Stream: h.stream, Group: h.group, Consumer: consumer,
	}, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return reg, h.run(e)
}

// sumCounter sums counter name over the registries, only its series with
// one of outcomes as outcome label when outcomes are given.
func sumCounter(t *testing.T, regs []*prometheus.Registry, name string, outcomes ...string) int64 {
	t.Helper()
	var n float64
	for _, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				keep := len(outcomes) == 0
				for _, l := range m.GetLabel() {
					keep = keep || (l.GetName() == "outcome" && slices.Contains(outcomes, l.GetValue()))
				}
				if keep {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return int64(n)
}

// promStats reads the Prometheus counters that Stats mirrors, summed over
// the registries of several workers.
func promStats(t *testing.T, regs ...*prometheus.Registry) stats.Counts {
	t.Helper()
	sum := func(name string, outcomes ...string) int64 { return sumCounter(t, regs, name, outcomes...) }
	return stats.Counts{
		Received:   sum("relay_events_received_total"),
		Matched:    sum("relay_events_matched_total"),
		Unmatched:  sum("relay_events_unmatched_total"),
		Malformed:  sum("relay_events_malformed_total"),
		Successes:  sum("relay_invocations_total", "success"),
		Failures:   sum("relay_invocations_total", "failure", "timeout", "oom", "lost"),
		Retries:    sum("relay_retries_total"),
		DLQEntries: sum("relay_dlq_entries_total"),
	}
}

func (h *harness) readStats() stats.Counts {
	h.t.Helper()
	s, err := redisstats.Read(context.Background(), h.rc, h.stream, h.group)
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

// TestStatsCountAKnownSequence runs two workers over one group and checks
// the cluster-wide counters in Redis against the sequence and against the
// sum of the workers' Prometheus counters.
func TestStatsCountAKnownSequence(t *testing.T) {
	h := newHarness(t, map[string]string{"shop": statsApp})
	h.handle("shop/ok.run", nil)
	h.handle("shop/flaky.run", func(_ context.Context, req runtime.Request) error {
		if req.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	})
	h.handle("shop/bad.run", func(context.Context, runtime.Request) error { return errors.New("always fails") })
	reg1, stop1 := statsWorker(h, "c1", h.rc)
	reg2, stop2 := statsWorker(h, "c2", h.rc)
	for _, kind := range []string{"ok", "flaky", "bad", "other"} {
		h.publish("event", fmt.Sprintf(`{"kind":%q}`, kind))
	}
	h.publish("event", `[1]`)
	testutil.WaitFor(t, 10*time.Second, "all settled", func() bool {
		return h.settled() && len(h.dlqEntries()) == 2 && h.calls.Count("shop/flaky.run") == 2
	})
	stop1()
	stop2()

	got := h.readStats()
	if diff := cmp.Diff(promStats(t, reg1, reg2), got); diff != "" {
		t.Errorf("stats differ from the workers' Prometheus counters (-prometheus +redis):\n%s", diff)
	}
	// The flaky message is delivered at least twice, so it is received and
	// matched at least twice; everything else happened exactly once.
	if got.Received < 6 || got.Matched < 4 || got.Received != got.Matched+got.Unmatched+got.Malformed {
		t.Errorf("received %d, matched %d: want >= 6 and >= 4, received = matched+unmatched+malformed", got.Received, got.Matched)
	}
	got.Received, got.Matched = 0, 0
	want := stats.Counts{Unmatched: 1, Malformed: 1, Successes: 2, Failures: 2, Retries: 1, DLQEntries: 2}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

// TestStatsNeverHoldUpMessages points the stats at a Redis that is down:
// messages are still handled and acknowledged, the failure is logged, and
// the counts are written once that Redis is back.
func TestStatsNeverHoldUpMessages(t *testing.T) {
	h := newHarness(t, map[string]string{"shop": statsApp})
	h.handle("shop/ok.run", nil)
	statsSrv := redistest.Start(t, redistest.Options{})
	statsClient := redistest.Connect(t, statsSrv.Addr)
	statsSrv.Kill()
	statsWorker(h, "c1", statsClient)
	h.publish("event", `{"kind":"ok"}`)
	h.publish("event", `{"kind":"other"}`)
	testutil.WaitFor(t, 5*time.Second, "both acknowledged", func() bool { return h.settled() && h.calls.Count("shop/ok.run") == 1 })
	testutil.WaitFor(t, 5*time.Second, "stats failure logged", func() bool {
		return strings.Contains(h.logs.String(), "writing stats failed")
	})

	statsSrv.Restart(t)
	want := stats.Counts{Received: 2, Matched: 1, Unmatched: 1, Successes: 1}
	var got stats.Counts
	testutil.WaitFor(t, 10*time.Second, "counts written after the outage", func() bool {
		var err error
		got, err = redisstats.Read(context.Background(), statsClient, h.stream, h.group)
		return err == nil && got == want
	})
}

func TestReadStats(t *testing.T) {
	t.Parallel()
	rc := redistest.Client(t)
	ctx := t.Context()
	s := redistest.Name(t, "events")
	if got, err := redisstats.Read(ctx, rc, s, "g"); err != nil || got != (stats.Counts{}) {
		t.Errorf("ReadStats without a hash = %+v, %v; want zeros", got, err)
	}
	key := keys.Stats(s, "g")
	if err := rc.Do(ctx, rc.B().Hset().Key(key).FieldValue().FieldValue("received", "5").FieldValue("dlq_entries", "2").
		FieldValue("future_counter", "1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if got, err := redisstats.Read(ctx, rc, s, "g"); err != nil || got != (stats.Counts{Received: 5, DLQEntries: 2}) {
		t.Errorf("ReadStats = %+v, %v", got, err)
	}
	if err := rc.Do(ctx, rc.B().Hset().Key(key).FieldValue().FieldValue("retries", "many").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := redisstats.Read(ctx, rc, s, "g"); err == nil || !strings.Contains(err.Error(), `"retries"`) {
		t.Errorf("ReadStats with a bad field = %v; want an error naming it", err)
	}
}

func TestStatsIntervalValidates(t *testing.T) {
	apps := apptest.Load(t, map[string]string{"users": usersApp})
	_, err := relay.NewEngine(apps, relay.Components{}, relay.Config{StatsInterval: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "Config.StatsInterval") {
		t.Errorf("NewEngine error %v does not name Config.StatsInterval", err)
	}
}

// TestOnOutcomeSeesEveryOutcomeOnce: Config.OnOutcome is told each
// outcome of each delivery once, with the message id: here a failed
// attempt retried, then its success, which settled the message.
func TestOnOutcomeSeesEveryOutcomeOnce(t *testing.T) {
	pattern, err := yamlpattern.Parse("signups", []byte(`{type: [signup]}`))
	if err != nil {
		t.Fatal(err)
	}
	apps, err := app.NewSet(&app.App{Name: "signups", Rules: []app.Rule{{Handler: "mail.welcome", Pattern: pattern, Retries: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{"mail.welcome": func(_ context.Context, req runtime.Request) error {
		if req.Attempt == 1 {
			return errors.New("smtp timeout")
		}
		return nil
	}})
	src := relaytest.NewStream()
	var mu sync.Mutex
	var got []string
	e, err := relay.NewEngine(apps, relay.Components{
		Source: src.Consumer("c1"), State: relaytest.NewStateStore(relaytest.WithStream(src), relaytest.WithDLQ(relaytest.NewDLQ("events"))), Runner: runner,
		Stream: "events", Group: "workers", Consumer: "c1",
	}, relay.Config{
		Logger: slog.New(slog.DiscardHandler), MinPendingIdle: 50 * time.Millisecond, ReclaimInterval: 10 * time.Millisecond,
		Backoff: []time.Duration{10 * time.Millisecond},
		OnOutcome: func(_ context.Context, id string, o relay.Outcome) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, fmt.Sprintf("%s %s/%s attempt %d: %s", id, o.App, o.Handler, o.Attempt, o.Kind))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	id, err := src.Publish(t.Context(), map[string]string{"event": `{"type":"signup"}`})
	if err != nil {
		t.Fatal(err)
	}
	stop := runEngine(t, e)
	testutil.WaitFor(t, 10*time.Second, "the message acknowledged", func() bool { return src.Lag() == 0 && !src.IsPending(id) })
	stop()
	want := []string{id + " signups/mail.welcome attempt 1: retrying", id + " signups/mail.welcome attempt 2: succeeded"}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, want) {
		t.Errorf("OnOutcome told %q, want %q", got, want)
	}
}
