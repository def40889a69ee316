package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/matcher/yamlpattern"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

// The tests in this file drive an Engine with its production timings (1m
// MinPendingIdle, 30s reclaim interval, 1m/2m/... backoff, 30s lease
// grace) on relaytest's fakes, inside a testing/synctest bubble: the
// Engine's timers and the fakes' clock are the bubble's, so the minutes
// pass in virtual time and the times the tests assert are exact. The
// integration tests beside them run the same paths on a real redis-server
// with shrunk timings.

// The fake world has one app, "shop", with one rule: orders.charge on
// {"kind":"order"}.
const (
	fakeStream = "events"
	fakeGroup  = "workers"
	fakeField  = "shop/orders.charge"
)

// onFakes is one stream and consumer group, its invocation state, its
// dead-letter queue and a scripted Runner, all in memory. Build it inside
// the bubble.
type onFakes struct {
	t      *testing.T
	src    *relaytest.Stream
	state  *relaytest.StateStore
	dlq    *relaytest.DLQ
	runner *startTimes
	apps   *app.Set
}

// startTimes is a fake Runner that also records when each run started.
type startTimes struct {
	*relaytest.Runner
	mu sync.Mutex
	at []time.Time
}

func (s *startTimes) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	s.mu.Lock()
	s.at = append(s.at, time.Now())
	s.mu.Unlock()
	return s.Runner.Run(ctx, req)
}

func (s *startTimes) starts() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.at...)
}

// newOnFakes builds the fakes, with opts (WithClock) for the stream, the
// state store and the DLQ, and the shop app with rule (its Handler and
// Pattern are filled in).
func newOnFakes(t *testing.T, rule app.Rule, opts ...relaytest.Option) *onFakes {
	t.Helper()
	pattern, err := yamlpattern.Parse("shop", []byte(`{kind: [order]}`))
	if err != nil {
		t.Fatal(err)
	}
	rule.Handler, rule.Pattern = "orders.charge", pattern
	apps, err := app.NewSet(&app.App{Name: "shop", Rules: []app.Rule{rule}})
	if err != nil {
		t.Fatal(err)
	}
	src, dlq := relaytest.NewStream(opts...), relaytest.NewDLQ(fakeStream, opts...)
	return &onFakes{
		t:      t,
		src:    src,
		state:  relaytest.NewStateStore(append(opts, relaytest.WithStream(src), relaytest.WithDLQ(dlq))...),
		dlq:    dlq,
		runner: &startTimes{Runner: relaytest.NewRunner()},
		apps:   apps,
	}
}

// run starts an Engine as consumer with cfg (zero fields are the
// production defaults; the log is discarded unless cfg sets a Logger)
// until the test ends or stop is called.
func (f *onFakes) run(consumer string, cfg relay.Config) (stop func()) {
	f.t.Helper()
	_, stop = f.engine(consumer, cfg)
	return stop
}

// engine is run, returning the Engine too.
func (f *onFakes) engine(consumer string, cfg relay.Config) (_ *relay.Engine, stop func()) {
	f.t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e, err := relay.NewEngine(f.apps, relay.Components{
		Source: f.src.Consumer(consumer), State: f.state, Runner: f.runner,
		Stream: fakeStream, Group: fakeGroup, Consumer: consumer,
	}, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return e, runEngine(f.t, e)
}

// publish appends an order event and returns its id.
func (f *onFakes) publish() string {
	f.t.Helper()
	id, err := f.src.Publish(context.Background(), map[string]string{"event": `{"kind":"order"}`})
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

// settle lets virtual time pass until every entry was delivered and
// nothing is pending, failing after limit, and then until every goroutine
// of the bubble is blocked: the Engine retains a message's state after its
// XACK, in a step of its own.
func (f *onFakes) settle(limit time.Duration) {
	f.t.Helper()
	for deadline := time.Now().Add(limit); f.src.Lag() > 0 || len(f.src.Pending()) > 0; {
		if time.Now().After(deadline) {
			f.t.Fatalf("still pending after %s of virtual time: %+v", limit, f.src.Pending())
		}
		time.Sleep(time.Second)
	}
	synctest.Wait()
}

// value returns the state of the shop/orders.charge invocation of id.
func (f *onFakes) value(id string) string {
	return f.state.Get(invocation.Key{Stream: fakeStream, Group: fakeGroup, MessageID: id})[fakeField]
}

// wantRetained fails the test unless id's state is retained with the
// production retention TTL and its invocation's value starts with prefix.
func (f *onFakes) wantRetained(id, prefix string) {
	f.t.Helper()
	key := invocation.Key{Stream: fakeStream, Group: fakeGroup, MessageID: id}
	st := f.state.Get(key)
	if !strings.HasPrefix(st[fakeField], prefix) || st["__terminal"] != "1" {
		f.t.Errorf("state of %s = %v, want %s... and retained", id, st, prefix)
	}
	if ttl, ok := f.state.TTL(key); !ok || ttl <= relay.DefaultRetention-time.Hour || ttl > relay.DefaultRetention {
		f.t.Errorf("retention TTL of %s = %s (%v), want about %s", id, ttl, ok, relay.DefaultRetention)
	}
}

// A failed attempt's retry runs no earlier than its backoff and no later
// than the first reclaim that finds the message idle after it: the retry
// timing is quantized by MinPendingIdle and the reclaim interval
// (docs/delivery.md#attempts-retries-backoff).
func TestFakesRetryRunsAtTheFirstReclaimAfterItsBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Retries: 2})
		f.runner.Script(fakeField, relaytest.Fail(1, "card declined"), relaytest.Fail(1, "card declined"))
		f.run("c1", relay.Config{})
		id := f.publish()
		f.settle(time.Hour)

		reqs, at := f.runner.Requests(fakeField), f.runner.starts()
		if len(reqs) != 3 {
			t.Fatalf("runs = %+v, want attempts 1, 2 and 3", reqs)
		}
		for i, r := range reqs {
			if r.Attempt != i+1 || r.MessageID != id {
				t.Errorf("run %d = attempt %d of %s, want attempt %d of %s", i+1, r.Attempt, r.MessageID, i+1, id)
			}
		}
		for i, backoff := range relay.DefaultBackoff[:2] {
			gap := at[i+1].Sub(at[i])
			latest := backoff + relay.DefaultMinPendingIdle + relay.DefaultReclaimInterval
			if gap < backoff || gap > latest {
				t.Errorf("attempt %d ran %s after attempt %d, want between its backoff %s and %s", i+2, gap, i+1, backoff, latest)
			}
		}
		f.wantRetained(id, "ok")
		if es, _ := f.dlq.List(context.Background(), dlq.Filter{}); len(es) != 0 {
			t.Errorf("DLQ = %+v, want nothing: the last attempt succeeded", es)
		}
	})
}

// Leases, backoffs and PEL idle times are read from the server's clock
// (docs/delivery.md#invocation-state), here a ManualClock of the fakes,
// not from the worker's: an hour on the worker's clock (the bubble's)
// redelivers nothing and runs no retry while the server's clock stands
// still; once it passes the backoff, the next reclaim runs the retry.
func TestFakesRetryWaitsForTheServersClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		server := relaytest.NewManualClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
		f := newOnFakes(t, app.Rule{Retries: 1}, relaytest.WithClock(server))
		f.runner.Script(fakeField, relaytest.Fail(1, "busy"))
		f.run("c1", relay.Config{})
		id := f.publish()
		if _, err := f.runner.WaitRuns(t.Context(), fakeField, 1); err != nil {
			t.Fatal(err)
		}

		time.Sleep(time.Hour)
		if reqs := f.runner.Requests(fakeField); len(reqs) != 1 {
			t.Fatalf("runs after an hour of worker time = %+v, want only attempt 1", reqs)
		}
		if p := f.src.Pending(); len(p) != 1 || p[0].Deliveries != 1 {
			t.Fatalf("PEL = %+v, want %s delivered once", p, id)
		}
		if v := f.value(id); !strings.HasPrefix(v, "next_attempt_at:") {
			t.Fatalf("state = %q, want the retry recorded", v)
		}

		server.Advance(relay.DefaultBackoff[0])
		reqs, err := f.runner.WaitRuns(t.Context(), fakeField, 2)
		if err != nil {
			t.Fatal(err)
		}
		if reqs[1].Attempt != 2 {
			t.Errorf("second run = attempt %d, want 2", reqs[1].Attempt)
		}
		f.settle(time.Hour)
		f.wantRetained(id, "ok")
	})
}

// A handler that runs for ten times MinPendingIdle is kept by its worker's
// heartbeat: another worker reclaiming every 30s never takes the entry,
// its delivery count stays 1 and the handler runs once
// (docs/delivery.md#concurrency-and-heartbeat).
func TestFakesHeartbeatKeepsALongHandlerFromReclaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Timeout: 15 * time.Minute})
		release := make(chan struct{})
		f.runner.Script(fakeField, relaytest.Block(release, relaytest.Succeed()))
		f.run("c1", relay.Config{})
		id := f.publish()
		if _, err := f.runner.WaitRuns(t.Context(), fakeField, 1); err != nil {
			t.Fatal(err)
		}
		f.run("c2", relay.Config{})

		time.Sleep(10 * relay.DefaultMinPendingIdle)
		if p := f.src.Pending(); len(p) != 1 || p[0].ID != id || p[0].Consumer != "c1" || p[0].Deliveries != 1 {
			t.Errorf("PEL after 10m of a running handler = %+v, want %s with c1, delivered once", p, id)
		}
		close(release)
		f.settle(time.Hour)
		if reqs := f.runner.Requests(fakeField); len(reqs) != 1 {
			t.Errorf("runs = %+v, want one", reqs)
		}
		f.wantRetained(id, "ok")
	})
}

// Entries a consumer read and then left (it died before claiming
// anything) are taken over by a live worker once they have been idle for
// MinPendingIdle, at the next reclaim, and run as attempt 1
// (docs/delivery.md#from-entry-to-acknowledgement).
func TestFakesDeadConsumersEntriesAreReclaimedAfterMinPendingIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{})
		var ids []string
		for range 3 {
			ids = append(ids, f.publish())
		}
		if msgs, err := f.src.Consumer("dead").Read(t.Context(), 3); err != nil || len(msgs) != 3 {
			t.Fatalf("dead consumer read %d entries (%v), want 3", len(msgs), err)
		}
		readAt := time.Now()
		f.run("c1", relay.Config{})
		f.settle(time.Hour)

		reqs, at := f.runner.Requests(fakeField), f.runner.starts()
		if len(reqs) != 3 {
			t.Fatalf("runs = %+v, want one per entry", reqs)
		}
		latest := relay.DefaultMinPendingIdle + relay.DefaultReclaimInterval
		for i, r := range reqs {
			if r.Attempt != 1 {
				t.Errorf("%s ran as attempt %d, want 1: the dead consumer claimed nothing", r.MessageID, r.Attempt)
			}
			if after := at[i].Sub(readAt); after < relay.DefaultMinPendingIdle || after > latest {
				t.Errorf("%s ran %s after the dead consumer read it, want between %s and %s", r.MessageID, after, relay.DefaultMinPendingIdle, latest)
			}
		}
		for _, id := range ids {
			f.wantRetained(id, "ok")
		}
	})
}

// A worker that dies mid-handler leaves its claim running. The next
// delivery finds the lease expired only after the rule's timeout plus the
// lease grace, and then charges the lost attempt
// (docs/delivery.md#attempts-retries-backoff): with a retry left, attempt
// 2 runs; when it was the last attempt, the invocation is dead-lettered
// without running again. Either way the loss is counted once, as
// relay_invocations_total{outcome="lost"}, and as a retry when one was left.
func TestFakesLostAttemptIsChargedWhenItsLeaseExpires(t *testing.T) {
	for _, c := range []struct {
		name    string
		retries int
	}{{"retry left", 1}, {"last attempt", 0}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rule := app.Rule{Retries: c.retries}
				if c.retries == 0 {
					rule.Retries = app.NoRetries
				}
				f := newOnFakes(t, rule)
				id := f.publish()
				// The dead worker read the entry and claimed attempt 1 with
				// the lease an Engine takes: timeout (the default 30s) plus
				// the lease grace.
				if _, err := f.src.Consumer("dead").Read(t.Context(), 1); err != nil {
					t.Fatal(err)
				}
				lease := app.DefaultTimeout + relay.DefaultLeaseGrace
				r := f.state.Claim(t.Context(), []invocation.ClaimRequest{{Key: invocation.Key{Stream: fakeStream, Group: fakeGroup, MessageID: id},
					Field: fakeField, Lease: lease, MaxAttempts: c.retries + 1}})
				if claim, err := r[0].Claim, r[0].Err; err != nil || claim.Status != invocation.Claimed {
					t.Fatalf("dead worker's claim = %+v, %v", claim, err)
				}
				claimedAt := time.Now()

				reg := prometheus.NewRegistry()
				f.run("c1", relay.Config{Metrics: reg})
				f.settle(time.Hour)

				reqs, at := f.runner.Requests(fakeField), f.runner.starts()
				es, err := f.dlq.List(context.Background(), dlq.Filter{})
				if err != nil {
					t.Fatal(err)
				}
				if c.retries > 0 {
					if len(reqs) != 1 || reqs[0].Attempt != 2 {
						t.Fatalf("runs = %+v, want attempt 2 only", reqs)
					}
					if after := at[0].Sub(claimedAt); after < lease {
						t.Errorf("attempt 2 ran %s after the lost claim, before its lease of %s expired", after, lease)
					}
					if len(es) != 0 {
						t.Errorf("DLQ = %+v, want nothing", es)
					}
					f.wantRetained(id, "ok")
				} else {
					if len(reqs) != 0 {
						t.Errorf("runs = %+v, want none: the lost attempt was the last", reqs)
					}
					if len(es) != 1 || es[0].OriginalID != id || es[0].App != "shop" || es[0].Handler != "orders.charge" || es[0].HandlerAttempts != 1 {
						t.Errorf("DLQ = %+v, want one entry for %s after 1 attempt", es, id)
					}
					if len(es) == 1 && !strings.HasPrefix(es[0].Reason, "exhausted after 1 attempt (the last attempt's outcome was not recorded") {
						t.Errorf("DLQ reason %q, want it to say exhausted after 1 attempt", es[0].Reason)
					}
					f.wantRetained(id, "exhausted:1:")
				}
				if n := invocationsTotal(t, reg, "lost"); n != 1 {
					t.Errorf(`relay_invocations_total{outcome="lost"} = %v, want 1`, n)
				}
				// The lost attempt is a failed one; it was retried only when
				// a retry was left.
				if n, want := shopCounter(t, reg, "relay_retries_total", ""), float64(c.retries); n != want {
					t.Errorf("relay_retries_total = %v, want %v", n, want)
				}
			})
		})
	}
}

// invocationsTotal returns relay_invocations_total{app="shop",
// handler="orders.charge",outcome=outcome} as gathered from reg.
func invocationsTotal(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	t.Helper()
	return shopCounter(t, reg, "relay_invocations_total", outcome)
}

// shopCounter returns the counter name{app="shop",handler="orders.charge"}
// (and outcome, unless empty) as gathered from reg; 0 when it is missing.
func shopCounter(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	return shopMetric(t, reg, name, map[string]string{"outcome": outcome})
}

// shopMetric returns the counter or gauge name{app="shop",
// handler="orders.charge"} whose other labels are labels (a label missing
// from the metric reads ""), as gathered from reg; 0 when it is missing.
func shopMetric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if got["app"] != "shop" || got["handler"] != "orders.charge" {
				continue
			}
			for k, v := range labels {
				if got[k] != v {
					continue metrics
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// A graceful stop waits DefaultShutdownTimeout for a running handler, then
// abandons it: the attempt is given back uncharged and the message stays
// pending, so the next worker runs attempt 1 again
// (docs/delivery.md#shutdown).
func TestFakesGracefulStopGivesTheAttemptBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Timeout: 10 * time.Minute})
		f.runner.Script(fakeField, relaytest.Hang())
		stop := f.run("c1", relay.Config{})
		id := f.publish()
		if _, err := f.runner.WaitRuns(t.Context(), fakeField, 1); err != nil {
			t.Fatal(err)
		}
		stoppedAt := time.Now()
		stop()
		if took := time.Since(stoppedAt); took != relay.DefaultShutdownTimeout {
			t.Errorf("Run returned %s after the stop, want the shutdown timeout %s", took, relay.DefaultShutdownTimeout)
		}
		if !f.src.IsPending(id) {
			t.Fatal("an abandoned message was acknowledged")
		}
		if v := f.value(id); !strings.HasPrefix(v, "next_attempt_at:") || attemptsUsed(t, v) != 0 {
			t.Fatalf("state after the stop = %q, want the attempt given back uncharged", v)
		}

		f.run("c2", relay.Config{})
		reqs, err := f.runner.WaitRuns(t.Context(), fakeField, 2)
		if err != nil {
			t.Fatal(err)
		}
		if reqs[1].Attempt != 1 {
			t.Errorf("the next worker ran attempt %d, want 1", reqs[1].Attempt)
		}
		f.settle(time.Hour)
		f.wantRetained(id, "ok")
	})
}

// A Go handler that panics is dead-lettered with the panic's stack, cut
// to a few KiB, on the lines after its reason, and its stack is in the
// log at DEBUG, not only in the Outcome OnOutcome gets.
func TestFakesPanicStackReachesTheDLQAndTheLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Retry: app.Retries(0)})
		fn := runtime.NewFunc(map[string]runtime.HandlerFunc{fakeField: func(context.Context, runtime.Request) error {
			panic("kaboom")
		}})
		f.runner.Script(fakeField, func(ctx context.Context, req runtime.Request) error {
			_, err := fn.Run(ctx, req)
			return err
		})
		logs := &testutil.Buffer{}
		f.run("c1", relay.Config{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		f.publish()
		f.settle(time.Hour)
		es, err := f.dlq.List(t.Context(), dlq.Filter{})
		if err != nil || len(es) != 1 {
			t.Fatalf("DLQ entries %v, %v; want one", es, err)
		}
		reason := es[0].Reason
		first, stack, _ := strings.Cut(reason, "\n")
		if !strings.Contains(first, "panic: kaboom") || !strings.Contains(stack, "goroutine") || len(stack) > 5<<10 {
			t.Errorf("DLQ reason = %q; want the panic, then its stack (at most a few KiB)", reason)
		}
		if got := logs.String(); !strings.Contains(got, `msg="handler panicked"`) || !strings.Contains(got, "panic=kaboom") || !strings.Contains(got, "stack=") {
			t.Errorf("log has no DEBUG line with the panic's stack:\n%s", got)
		}
	})
}

// relaytest.Outcomes.Ran counts the attempts that ran, where Of also has
// the outcomes of redeliveries that ran nothing (not due yet): three
// failures and a success are four attempts however often the reclaim
// came by.
func TestFakesOutcomesRanCountsAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{})
		f.runner.Script(fakeField, relaytest.Fail(1, "no"), relaytest.Fail(1, "no"), relaytest.Fail(1, "no"), relaytest.Succeed())
		outcomes := &relaytest.Outcomes{}
		f.run("c1", relay.Config{MaxWaiting: -1, OnOutcome: outcomes.Record})
		id := f.publish()
		f.settle(time.Hour)
		all, ran := outcomes.Of(id, "shop", "orders.charge"), outcomes.Ran(id, "shop", "orders.charge")
		var attempts []int
		for _, o := range ran {
			attempts = append(attempts, o.Attempt)
		}
		if !slices.Equal(attempts, []int{1, 2, 3, 4}) {
			t.Errorf("Ran attempts %v, want [1 2 3 4]", attempts)
		}
		if !slices.ContainsFunc(all, func(o relay.Outcome) bool { return o.Kind == relay.NotDue }) {
			t.Errorf("Of has no not-due outcome (%d outcomes): the reclaim never came early, the test shows nothing", len(all))
		}
	})
}

// A handler whose message leaves the PEL while it runs (another consumer
// acknowledged it, or Redis lost its data) is stopped at the next
// heartbeat: its attempt is marked orphaned, then ends as Gone, nothing is
// recorded, and its slot is free for live work
// (docs/delivery.md#concurrency-and-heartbeat).
func TestFakesHandlerOfAGoneMessageIsStopped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Timeout: 10 * time.Minute})
		var orphaned atomic.Bool
		var e *relay.Engine
		f.runner.Script(fakeField, func(ctx context.Context, req runtime.Request) error {
			<-ctx.Done()
			for _, r := range e.Running() {
				orphaned.Store(orphaned.Load() || r.Orphaned)
			}
			return fmt.Errorf("run %s/%s: %w", req.App, req.Handler, context.Cause(ctx))
		})
		outcomes := &relaytest.Outcomes{}
		e, _ = f.engine("c1", relay.Config{OnOutcome: outcomes.Record})
		id := f.publish()
		if _, err := f.runner.WaitRuns(t.Context(), fakeField, 1); err != nil {
			t.Fatal(err)
		}
		if err := f.src.Consumer("c2").Ack(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		time.Sleep(relay.DefaultMinPendingIdle / 3) // a heartbeat interval
		synctest.Wait()
		got := outcomes.Of(id, "shop", "orders.charge")
		if len(got) != 1 || got[0].Kind != relay.Gone {
			t.Fatalf("outcomes %+v, want one Gone", got)
		}
		if !orphaned.Load() {
			t.Error("Running() did not mark the attempt orphaned while its handler was being stopped")
		}
		if rs := e.Running(); len(rs) != 0 {
			t.Errorf("Running() = %+v after the handler was stopped, want none", rs)
		}
		if v := f.value(id); !strings.HasPrefix(v, "running:") {
			t.Errorf("state = %q, want the lease untouched: nothing is recorded for a gone message", v)
		}
	})
}

// A message kept for its retry that leaves the PEL before the retry is due
// (another consumer acknowledged it, or Redis lost its data) ends as Gone
// at the retry's claim, not Done: nothing says it finished, and the
// handler does not run again (docs/delivery.md#concurrency-and-heartbeat).
func TestFakesRetryOfAGoneMessageIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{})
		f.runner.Script(fakeField, relaytest.Fail(1, "transient"), relaytest.Succeed())
		outcomes := &relaytest.Outcomes{}
		f.run("c1", relay.Config{Backoff: []time.Duration{2 * time.Second}, OnOutcome: outcomes.Record})
		id := f.publish()
		if _, err := f.runner.WaitRuns(t.Context(), fakeField, 1); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if err := f.src.Consumer("c2").Ack(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second) // past the retry's due time, before a heartbeat
		synctest.Wait()
		got := outcomes.Of(id, "shop", "orders.charge")
		if len(got) != 2 || got[0].Kind != relay.Retrying || got[1].Kind != relay.Gone {
			t.Fatalf("outcomes %+v, want Retrying then Gone", got)
		}
		if n := len(f.runner.Requests(fakeField)); n != 1 {
			t.Errorf("runs = %d, want 1: a message no longer pending is not run again", n)
		}
	})
}

// A rule's own concurrency (per worker) bounds its invocations below the
// app's: with the app at 8 and the rule at 1, three events run one at a
// time (docs/flow-control.md).
func TestFakesRuleConcurrencyPerWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Limits: app.Limits{Concurrency: 1}})
		f.apps.Get("shop").Concurrency = 8
		var running, peak atomic.Int32
		for range 3 {
			f.runner.Script(fakeField, func(context.Context, runtime.Request) error {
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(time.Second)
				running.Add(-1)
				return nil
			})
		}
		f.run("c1", relay.Config{})
		for range 3 {
			f.publish()
		}
		f.settle(time.Hour)
		if n := len(f.runner.Requests(fakeField)); n != 3 {
			t.Fatalf("%d runs, want 3", n)
		}
		if p := peak.Load(); p != 1 {
			t.Errorf("at most %d ran at once, want 1", p)
		}
	})
}

// An invocation whose message is older than its rule's max_age when it
// would start is dead-lettered, reason "older than max_age 1h", without
// running; a fresh one runs (docs/flow-control.md#maximum-event-age).
func TestFakesMaxAgeDeadLettersWithoutRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Limits: app.Limits{MaxAge: time.Hour}})
		old := f.publish()
		time.Sleep(2 * time.Hour)
		fresh := f.publish()
		f.run("c1", relay.Config{})
		f.settle(time.Hour)
		reqs := f.runner.Requests(fakeField)
		if len(reqs) != 1 || reqs[0].MessageID != fresh {
			t.Fatalf("runs %+v, want the fresh message's alone", reqs)
		}
		es, err := f.dlq.List(t.Context(), dlq.Filter{})
		if err != nil || len(es) != 1 {
			t.Fatalf("DLQ entries %+v, %v; want one", es, err)
		}
		if e := es[0]; e.OriginalID != old || e.Reason != "older than max_age 1h" || e.HandlerAttempts != 0 {
			t.Errorf("DLQ entry %+v; want the old message's, reason \"older than max_age 1h\", no attempt run", e)
		}
		f.wantRetained(fresh, "ok")
	})
}

// A retry starts within a second of its due time, with the production
// backoff (1m, then 2m): the worker that left its message pending keeps it
// and delivers it again then, rather than waiting for a reclaim to find it
// idle (MinPendingIdle, every ReclaimInterval: up to 1m30s late). With
// MaxWaiting negative the reclaim is all there is, and the retry is late
// by up to a reclaim cycle (docs/delivery.md#attempts-retries-backoff).
func TestFakesRetryStartsAtItsDueTime(t *testing.T) {
	for _, c := range []struct {
		name       string
		maxWaiting int
		late       time.Duration // the most a retry may start after its due time
	}{
		{"kept by its worker", 0, time.Second},
		{"reclaim only", -1, relay.DefaultMinPendingIdle + relay.DefaultReclaimInterval},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newOnFakes(t, app.Rule{})
				// Each failed attempt runs 10s: its due time is off the
				// reclaim's grid, counted from the delivery.
				const runs = 10 * time.Second
				slowFail := func(context.Context, runtime.Request) error {
					time.Sleep(runs)
					return &runtime.ExitError{Code: 1, Stderr: "try again"}
				}
				f.runner.Script(fakeField, slowFail, slowFail, relaytest.Succeed())
				f.run("c1", relay.Config{MaxWaiting: c.maxWaiting})
				id := f.publish()
				f.settle(time.Hour)
				starts := f.runner.starts()
				if len(starts) != 3 {
					t.Fatalf("%d attempts, want 3", len(starts))
				}
				for i, backoff := range relay.DefaultBackoff[:2] {
					if gap := starts[i+1].Sub(starts[i]) - runs; gap < backoff || gap > backoff+c.late {
						t.Errorf("attempt %d started %s after attempt %d failed, want between %s and %s", i+2, gap, i+1, backoff, backoff+c.late)
					}
				}
				f.wantRetained(id, "ok")
			})
		})
	}
}

// Engine.Running lists the attempts running now, with when they started
// and their timeout, so a hung handler can be told from a slow one; the
// Limiter says how many of each app's slots they hold.
func TestFakesRunningListsTheAttemptsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Timeout: time.Minute})
		release := make(chan struct{})
		f.runner.Script(fakeField, relaytest.Block(release, relaytest.Succeed()))
		lim, err := relay.NewLimiter(4)
		if err != nil {
			t.Fatal(err)
		}
		e, _ := f.engine("c1", relay.Config{Limiter: lim})
		id := f.publish()
		if _, err := f.runner.WaitRuns(t.Context(), fakeField, 1); err != nil {
			t.Fatal(err)
		}
		started := time.Now()
		time.Sleep(90 * time.Second)
		rs := e.Running()
		if len(rs) != 1 {
			t.Fatalf("Running() = %+v, want the one attempt", rs)
		}
		r := rs[0]
		if r.App != "shop" || r.Handler != "orders.charge" || r.MessageID != id || r.Attempt != 1 || r.MaxAttempts != 5 ||
			!r.Started.Equal(started) || r.Timeout != time.Minute {
			t.Errorf("Running() = %+v, want shop/orders.charge attempt 1 of 5 of %s, started at %s, timeout 1m", r, id, started)
		}
		if !r.Stalled(time.Now()) || r.Stalled(started.Add(time.Minute)) {
			t.Errorf("Stalled: want true 90s after its start with a 1m timeout, false at 1m")
		}
		global, apps := lim.InUse()
		if global != 1 || len(apps) != 1 || apps[0] != (relay.AppSlots{App: "shop", InUse: 1, Limit: 2}) {
			t.Errorf("InUse() = %d, %+v; want 1 and shop 1 of 2", global, apps)
		}
		close(release)
		f.settle(time.Minute)
		if rs := e.Running(); len(rs) != 0 {
			t.Errorf("Running() after the attempt = %+v, want none", rs)
		}
		if global, apps := lim.InUse(); global != 0 || apps[0].InUse != 0 {
			t.Errorf("InUse() after the attempt = %d, %+v; want none taken", global, apps)
		}
	})
}

// A Go function that ignores its context and runs past its rule's timeout
// is a timed-out attempt, not a success, when the shutdown timeout abandons
// it after the rule's timeout expired: the attempt is charged, its retry
// scheduled, and the message stays pending (docs/embedding.md#go-handlers).
func TestFakesShutdownAfterTheTimeoutIsATimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Timeout: time.Second})
		fn := runtime.NewFunc(map[string]runtime.HandlerFunc{fakeField: func(context.Context, runtime.Request) error {
			time.Sleep(3 * time.Second) // ignores its context
			return nil
		}})
		f.runner.Script(fakeField, func(ctx context.Context, req runtime.Request) error {
			_, err := fn.Run(ctx, req)
			return err
		})
		reg := prometheus.NewRegistry()
		stop := f.run("c1", relay.Config{ShutdownTimeout: 200 * time.Millisecond, Metrics: reg})
		id := f.publish()
		if _, err := f.runner.WaitRuns(t.Context(), fakeField, 1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1600 * time.Millisecond)
		stop()
		if !f.src.IsPending(id) {
			t.Fatal("a handler that outlived its timeout got its message acknowledged")
		}
		if v := f.value(id); !strings.HasPrefix(v, "next_attempt_at:") || attemptsUsed(t, v) != 1 {
			t.Errorf("state after the stop = %q, want attempt 1 charged and its retry scheduled", v)
		}
		if n := invocationsTotal(t, reg, "timeout"); n != 1 {
			t.Errorf("relay_invocations_total{outcome=timeout} = %v, want 1", n)
		}
	})
}

// A Go function that ignores its context and succeeds within its rule's
// timeout, but after the shutdown timeout abandoned it, has its success
// recorded: the message is acknowledged and the handler does not run again
// (docs/embedding.md#go-handlers).
func TestFakesSuccessAfterTheShutdownTimeoutIsRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Timeout: 20 * time.Second, Retry: app.Retries(0)})
		fn := runtime.NewFunc(map[string]runtime.HandlerFunc{fakeField: func(context.Context, runtime.Request) error {
			time.Sleep(5 * time.Second) // ignores its context
			return nil
		}})
		f.runner.Script(fakeField, func(ctx context.Context, req runtime.Request) error {
			_, err := fn.Run(ctx, req)
			return err
		})
		var got []relay.Outcome
		var mu sync.Mutex
		stop := f.run("c1", relay.Config{ShutdownTimeout: time.Second, OnOutcome: func(_ context.Context, _ string, o relay.Outcome) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, o)
		}})
		id := f.publish()
		if _, err := f.runner.WaitRuns(t.Context(), fakeField, 1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		stop() // the shutdown timeout ends 3 s before the handler returns
		if f.src.IsPending(id) {
			t.Errorf("the message of a handler that succeeded after the shutdown timeout is still pending; state %q", f.value(id))
		}
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 1 || got[0].Kind != relay.Succeeded || got[0].WriteErr != nil {
			t.Errorf("outcomes %+v, want one success, written", got)
		}
		f.run("c2", relay.Config{})
		f.settle(time.Hour)
		if n := len(f.runner.Requests(fakeField)); n != 1 {
			t.Errorf("runs = %d, want 1: the success was recorded", n)
		}
		if es, _ := f.dlq.List(context.Background(), dlq.Filter{}); len(es) != 0 {
			t.Errorf("DLQ = %+v, want empty", es)
		}
	})
}

// A handler that exits runtime.ExitPermanent, or a Go function that returns
// runtime.Permanent, fails its invocation for good: with the default four
// retries left it is dead-lettered after its one attempt, with its reason,
// and never retried (docs/delivery.md#permanent-failures).
func TestFakesPermanentFailureIsDeadLetteredAtOnce(t *testing.T) {
	for name, fail := range map[string]relaytest.Reply{
		"exit code 65": relaytest.Fail(runtime.ExitPermanent, "order 7 has no customer"),
		"Go function": func(ctx context.Context, _ runtime.Request) error {
			_, err := runtime.NewFunc(map[string]runtime.HandlerFunc{"h": func(context.Context, runtime.Request) error {
				return runtime.Permanent(errors.New("order 7 has no customer"))
			}}).Run(ctx, runtime.Request{App: "shop", Handler: "h"})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newOnFakes(t, app.Rule{}) // the template's default: 4 retries
				f.runner.Script(fakeField, fail, relaytest.Succeed())
				f.run("c1", relay.Config{})
				id := f.publish()
				f.settle(time.Hour)

				if reqs := f.runner.Requests(fakeField); len(reqs) != 1 {
					t.Fatalf("runs = %d, want 1: a permanent failure is not retried", len(reqs))
				}
				es, _ := f.dlq.List(context.Background(), dlq.Filter{})
				if len(es) != 1 || es[0].OriginalID != id || es[0].HandlerAttempts != 1 || !strings.Contains(es[0].Reason, "order 7 has no customer") ||
					!strings.Contains(es[0].Reason, "permanent") {
					t.Errorf("DLQ = %+v, want one entry for %s after 1 attempt, its reason saying why and that it is permanent", es, id)
				}
				f.wantRetained(id, "exhausted:1:")
			})
		})
	}
}

// downSource is a stream source whose Redis is gone: every read and
// reclaim fails. It counts the reclaims.
type downSource struct {
	*relaytest.Consumer
	mu       sync.Mutex
	reclaims int
	up       bool // Redis is back
}

func (d *downSource) isUp() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.up
}

func (d *downSource) Read(ctx context.Context, n int) ([]stream.Message, error) {
	if d.isUp() {
		return d.Consumer.Read(ctx, n)
	}
	time.Sleep(time.Second) // a dial timeout
	return nil, errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
}

func (d *downSource) Reclaim(ctx context.Context, minIdle time.Duration, n int) ([]stream.Message, []string, bool, error) {
	if d.isUp() {
		return d.Consumer.Reclaim(ctx, minIdle, n)
	}
	d.mu.Lock()
	d.reclaims++
	d.mu.Unlock()
	return nil, nil, false, errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
}

// While Redis is gone the reclaim loop backs off (passes 2, 4, 8, then 16
// intervals apart) and the read and reclaim loops each log the
// same error at ERROR once per 10 s window, the lines between at DEBUG
// (docs/operations.md#logs).
func TestFakesLoopsBackOffAndLogOnceWhileRedisIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{})
		src := &downSource{Consumer: f.src.Consumer("c1")}
		logs := &strings.Builder{}
		var mu sync.Mutex
		log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return logs.Write(p)
		}), &slog.HandlerOptions{Level: slog.LevelInfo}))
		e, err := relay.NewEngine(f.apps, relay.Components{Source: src, State: f.state, Runner: f.runner,
			Stream: fakeStream, Group: fakeGroup, Consumer: "c1"}, relay.Config{Logger: log, ReclaimInterval: time.Second, MinPendingIdle: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		stop := runEngine(t, e)
		time.Sleep(100 * time.Second)
		src.mu.Lock()
		reclaims := src.reclaims
		src.up = true
		src.mu.Unlock()
		// Back within the longest backoff: both loops say so, once.
		time.Sleep(30 * time.Second)
		stop()
		// 100 intervals: passes 2, 4, 8, then 16 s apart: about 8.
		if reclaims > 15 {
			t.Errorf("%d reclaims in 100 intervals while Redis is gone, want the loop to back off", reclaims)
		}
		mu.Lock()
		out := logs.String()
		mu.Unlock()
		for _, msg := range []string{"reclaim failed", "stream read failed"} {
			// At most one ERROR line per 10 s window: 11 in 100 s.
			if n := strings.Count(out, msg); n == 0 || n > 11 {
				t.Errorf("%d %q lines at ERROR in 100 s, want one per 10 s window:\n%s", n, msg, out)
			}
		}
		if !strings.Contains(out, "repeated=") {
			t.Errorf("no ERROR line counts the repeats logged at DEBUG:\n%s", out)
		}
		for _, msg := range []string{"stream read works again", "reclaim works again"} {
			if n := strings.Count(out, msg); n != 1 {
				t.Errorf("%d %q lines once Redis is back, want 1:\n%s", n, msg, out)
			}
		}
	})
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// lostReply is a StateStore whose first Claim runs but loses its reply,
// as a frozen connection does (invocation.ClaimUnknownError). It forwards
// Void, as a wrapper must for the Engine to see the capability (relay.go).
type lostReply struct {
	relay.StateStore
	lost atomic.Bool
}

func (s *lostReply) Claim(ctx context.Context, reqs []invocation.ClaimRequest) []invocation.ClaimResult {
	res := s.StateStore.Claim(ctx, reqs)
	for i, r := range res {
		if r.Err != nil || r.Status != invocation.Claimed || !s.lost.CompareAndSwap(false, true) {
			continue
		}
		res[i] = invocation.ClaimResult{Err: &invocation.ClaimUnknownError{
			Lease: invocation.Lease{Key: reqs[i].Key, Field: reqs[i].Field, Token: r.Lease.Token}, Err: context.DeadlineExceeded}}
	}
	return res
}

func (s *lostReply) Void(ctx context.Context, l invocation.Lease) error {
	v, ok := s.StateStore.(relay.ClaimVoider)
	if !ok {
		return errors.New("the state store cannot give claims back")
	}
	return v.Void(ctx, l)
}

// A claim that ran but whose reply was lost is given back at once on the
// fakes as on Redis (docs/delivery.md#lost-replies): its lease expires
// without charging an attempt, and the next delivery runs attempt 1.
func TestFakesLostClaimReplyIsGivenBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{})
		reg := prometheus.NewRegistry()
		e, err := relay.NewEngine(f.apps, relay.Components{
			Source: f.src.Consumer("c1"), State: &lostReply{StateStore: f.state}, Runner: f.runner,
			Stream: fakeStream, Group: fakeGroup, Consumer: "c1",
		}, relay.Config{Metrics: reg, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		runEngine(t, e)
		id := f.publish()
		f.settle(time.Hour)
		var attempts []int
		for _, r := range f.runner.Requests(fakeField) {
			attempts = append(attempts, r.Attempt)
		}
		if !slices.Equal(attempts, []int{1}) {
			t.Fatalf("attempts run = %v, want [1]: the lost claim's lease charged nothing", attempts)
		}
		if n := invocationsTotal(t, reg, "lost"); n != 0 {
			t.Errorf(`relay_invocations_total{outcome="lost"} = %v, want 0`, n)
		}
		if n := plainCounter(t, reg, "relay_claims_given_back_total"); n != 1 {
			t.Errorf("relay_claims_given_back_total = %v, want 1", n)
		}
		f.wantRetained(id, "ok")
	})
}

// plainCounter returns the value of the unlabelled counter name gathered
// from reg; 0 when it is missing.
func plainCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// A message this worker holds (its app is unavailable here) that another
// worker takes over and acknowledges leaves the held count at the next
// reclaim interval, on the fakes as on Redis: the fake Consumer says which
// messages it still owns (relay.OwnerChecker, docs/delivery.md#held-messages).
func TestFakesHeldMessageTakenOverIsForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{})
		f.apps = apptest.Load(t, map[string]string{"shop": "image: x\nevents:\n  - {handler: nodot, pattern: {kind: [order]}}\n"})
		if f.apps.Get("shop").Available() {
			t.Fatal("the shop app should be unavailable")
		}
		e, err := relay.NewEngine(f.apps, relay.Components{
			Source: f.src.Consumer("c1"), State: f.state, Runner: f.runner,
			Stream: fakeStream, Group: fakeGroup, Consumer: "c1",
		}, relay.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		runEngine(t, e)
		held := func() int {
			n := 0
			for _, h := range e.Holds() {
				n += h.Held
			}
			return n
		}
		id := f.publish()
		time.Sleep(time.Second)
		synctest.Wait()
		if n := held(); n != 1 {
			t.Fatalf("held = %d, want the message held", n)
		}
		// Another worker, where the app is available, takes it over and
		// acknowledges it.
		other := f.src.Consumer("c2")
		if _, err := other.Heartbeat(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if err := other.Ack(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		time.Sleep(relay.DefaultReclaimInterval)
		synctest.Wait()
		if n := held(); n != 0 {
			t.Errorf("held = %d a reclaim interval after another worker acknowledged the message, want 0", n)
		}
	})
}
