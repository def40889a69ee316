package relaytest_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/relaydev/relay/app"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
)

// attempts records when each attempt of each handler started, per event id
// ("user" field of the event).
type attempts struct {
	mu  sync.Mutex
	log map[string][]runAt
}

type runAt struct {
	attempt int
	at      time.Time
}

func (a *attempts) add(user string, req runtime.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.log[user] = append(a.log[user], runAt{req.Attempt, time.Now()})
}

func (a *attempts) get(user string) []runAt {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.log[user])
}

// TestEngineOnFakes drives a real Engine with the package's fakes and Go
// handlers only: no Redis, no containers. It runs in a synctest bubble, so
// the Engine's default timings (1m MinPendingIdle, 1m/2m backoff) pass in
// virtual time, and the gaps between attempts show the backoff schedule.
// The StateStore settles on the Stream and writes dead letters to the DLQ
// (WithStream, WithDLQ), as redisstate.Store does on one Redis.
func TestEngineOnFakes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		const streamName, group = "events", "workers"
		src := relaytest.NewStream()
		consumer := src.Consumer("worker-1")
		dead := relaytest.NewDLQ(streamName)
		state := relaytest.NewStateStore(relaytest.WithStream(src), relaytest.WithDLQ(dead))

		pattern, err := yamlpattern.Parse("signups", []byte(`{type: [signup]}`))
		if err != nil {
			t.Fatal(err)
		}
		apps, err := app.NewSet(&app.App{
			Name:  "signups",
			Rules: []app.Rule{{Handler: "mail.welcome", Pattern: pattern, Retries: 2, Timeout: 10 * time.Second}},
		})
		if err != nil {
			t.Fatal(err)
		}
		// The handler's behaviour depends on the user in the event: ada
		// succeeds, bob fails his first attempt, eve always fails.
		runs := &attempts{log: map[string][]runAt{}}
		runner := runtime.NewFunc(map[string]runtime.HandlerFunc{
			"signups/mail.welcome": func(ctx context.Context, req runtime.Request) error {
				ev, err := matcher.DecodeEvent(req.Event)
				if err != nil {
					return err
				}
				user, _ := ev["user"].(string)
				runs.add(user, req)
				switch {
				case user == "bob" && req.Attempt == 1:
					return errors.New("mail server busy")
				case user == "eve":
					return errors.New("mailbox does not exist")
				}
				return nil
			},
		})
		engine, err := relay.NewEngine(apps, relay.Components{
			Source: consumer, State: state, Runner: runner,
			Stream: streamName, Group: group, Consumer: "worker-1",
		}, relay.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}

		ids := map[string]string{}
		for _, ev := range []struct{ name, event string }{
			{"ada", `{"type":"signup","user":"ada"}`},
			{"bob", `{"type":"signup","user":"bob"}`},
			{"eve", `{"type":"signup","user":"eve"}`},
			{"unmatched", `{"type":"login","user":"ada"}`},
			{"malformed", `["not","an","object"]`},
		} {
			id, err := src.Publish(ctx, map[string]string{"event": ev.event})
			if err != nil {
				t.Fatal(err)
			}
			ids[ev.name] = id
		}

		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error)
		go func() { done <- engine.Run(runCtx) }()
		// Everything is decided within eve's 1m+2m of backoff plus a
		// reclaim or two: wait in virtual time until nothing is pending.
		deadline := time.Now().Add(time.Hour)
		for src.Lag() > 0 || len(src.Pending()) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("still pending after an hour of virtual time: %+v", src.Pending())
			}
			time.Sleep(time.Second)
		}
		stop()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}

		// ada: one successful attempt.
		if got := runs.get("ada"); len(got) != 1 || got[0].attempt != 1 {
			t.Errorf("ada's attempts = %+v, want one", got)
		}
		// bob: failed once, retried after the first backoff (1m), succeeded.
		bob := runs.get("bob")
		if len(bob) != 2 || bob[0].attempt != 1 || bob[1].attempt != 2 {
			t.Fatalf("bob's attempts = %+v, want 1 then 2", bob)
		}
		if gap := bob[1].at.Sub(bob[0].at); gap < relay.DefaultBackoff[0] {
			t.Errorf("bob's retry came %s after the failure, want at least the backoff %s", gap, relay.DefaultBackoff[0])
		}
		// eve: three attempts (retries: 2), 1m then 2m apart, then the DLQ.
		eve := runs.get("eve")
		if len(eve) != 3 {
			t.Fatalf("eve's attempts = %+v, want 3", eve)
		}
		for i, want := range relay.DefaultBackoff[:2] {
			if eve[i+1].attempt != i+2 {
				t.Errorf("eve's attempt %d reported attempt number %d", i+2, eve[i+1].attempt)
			}
			if gap := eve[i+1].at.Sub(eve[i].at); gap < want {
				t.Errorf("eve's attempt %d came %s after attempt %d, want at least %s", i+2, gap, i+1, want)
			}
		}

		entries, err := dead.List(ctx, dlq.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 2 {
			t.Fatalf("DLQ = %+v, want eve's exhausted invocation and the malformed message", entries)
		}
		byOriginal := map[string]dlq.Entry{}
		for _, e := range entries {
			byOriginal[e.OriginalID] = e
		}
		ev := byOriginal[ids["eve"]]
		if ev.App != "signups" || ev.Handler != "mail.welcome" || ev.HandlerAttempts != 3 ||
			!strings.Contains(ev.Reason, "mailbox does not exist") || ev.Group != group || ev.Consumer != "worker-1" ||
			ev.Event != `{"type":"signup","user":"eve"}` {
			t.Errorf("eve's DLQ entry = %+v", ev)
		}
		if m := byOriginal[ids["malformed"]]; m.App != dlq.MalformedName || m.HandlerAttempts != 0 {
			t.Errorf("malformed message's DLQ entry = %+v", m)
		}

		// Every message was acknowledged; the invocation state of those that
		// matched is retained, with the terminal outcome of each.
		for name, id := range ids {
			if src.IsPending(id) {
				t.Errorf("%s (%s) still pending", name, id)
			}
		}
		key := func(name string) invocation.Key {
			return invocation.Key{Stream: streamName, Group: group, MessageID: ids[name]}
		}
		for name, want := range map[string]string{"ada": "ok", "bob": "ok", "eve": "exhausted:3:"} {
			got := state.Get(key(name))
			v := got["signups/mail.welcome"]
			if !strings.HasPrefix(v, want) || got["__terminal"] != "1" {
				t.Errorf("%s's state = %v, want %s... and retained", name, got, want)
			}
			if want == "exhausted:3:" && !strings.HasSuffix(v, ":dlq") {
				t.Errorf("%s's state = %q, want the DLQ marker", name, v)
			}
			if ttl, ok := state.TTL(key(name)); !ok || ttl <= 0 || ttl > relay.DefaultRetention {
				t.Errorf("%s's retention TTL = %s, %v; want within %s", name, ttl, ok, relay.DefaultRetention)
			}
		}
		if got := state.Get(key("unmatched")); len(got) != 0 {
			t.Errorf("unmatched message has state %v, want none", got)
		}
	})
}

// TestEngineUnavailableChargesNothing shows the fake Runner driving the
// Engine through an outage: while the app is unavailable its message stays
// pending and no attempt is charged; once it can run, attempt 1 runs.
func TestEngineUnavailableChargesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		src := relaytest.NewStream()
		state := relaytest.NewStateStore(relaytest.WithStream(src), relaytest.WithDLQ(relaytest.NewDLQ("events")))
		pattern, err := yamlpattern.Parse("t", []byte(`{type: [order]}`))
		if err != nil {
			t.Fatal(err)
		}
		apps, err := app.NewSet(&app.App{Name: "orders", Rules: []app.Rule{{Handler: "ship", Pattern: pattern, Retries: 0}}})
		if err != nil {
			t.Fatal(err)
		}
		runner := relaytest.NewRunner()
		runner.Script("orders/ship", relaytest.Unavailable("image missing"), relaytest.Unavailable("image missing"), relaytest.Succeed())
		engine, err := relay.NewEngine(apps, relay.Components{
			Source: src.Consumer("w"), State: state, Runner: runner,
			Stream: "events", Group: "g", Consumer: "w",
		}, relay.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		id, err := src.Publish(ctx, map[string]string{"event": `{"type":"order"}`})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error)
		go func() { done <- engine.Run(runCtx) }()
		reqs, err := runner.WaitRuns(ctx, "orders/ship", 3)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// retries: 0 allows one attempt; it was never charged while the app
		// was unavailable, so the run that succeeded is attempt 1.
		for i, r := range reqs {
			if r.Attempt != 1 || r.MessageID != id {
				t.Errorf("run %d = attempt %d of %s, want attempt 1 of %s", i+1, r.Attempt, r.MessageID, id)
			}
		}
		if src.IsPending(id) {
			t.Error("message still pending after the successful run")
		}
	})
}

// An Engine on the fakes finds every optional capability of a source (the
// group, the PEL gauges, ping): its log says nothing about missing ones.
func TestEngineOnFakesMissesNoCapability(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pattern, err := yamlpattern.Parse("t", []byte(`{type: [order]}`))
		if err != nil {
			t.Fatal(err)
		}
		apps, err := app.NewSet(&app.App{Name: "orders", Rules: []app.Rule{{Handler: "ship", Pattern: pattern}}})
		if err != nil {
			t.Fatal(err)
		}
		var logs strings.Builder
		src := relaytest.NewStream()
		e, err := relay.NewEngine(apps, relay.Components{
			Source: src.Consumer("w"), State: relaytest.NewStateStore(relaytest.WithStream(src), relaytest.WithDLQ(relaytest.NewDLQ("events"))),
			Runner: relaytest.NewRunner(), Stream: "events", Group: "g", Consumer: "w",
		}, relay.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- e.Run(ctx) }()
		synctest.Wait()
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		for _, noise := range []string{"cannot create its consumer group", "does not report its PEL"} {
			if strings.Contains(logs.String(), noise) {
				t.Errorf("the log says %q on fakes:\n%s", noise, logs.String())
			}
		}
	})
}
