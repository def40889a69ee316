package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestRun runs the example's Worker on a private redis-server: a matching
// signup on one stream and an order on the other reach their Go handlers
// and are acknowledged with their state retained; an event no rule matches
// is acknowledged without running anything; the hourly schedule's latest
// occurrence is caught up at start and run; cancelling the context stops
// the Worker cleanly.
func TestRun(t *testing.T) {
	rc := redistest.Client(t)
	signups, orders, group := redistest.Name(t, "signups"), redistest.Name(t, "orders"), "embed"
	logs := &testutil.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- run(ctx, rc, []string{signups, orders}, group, "test-host", log) }()

	publish := func(stream, event string) string {
		t.Helper()
		id, err := rc.Do(ctx, rc.B().Xadd().Key(stream).Id("*").FieldValue().FieldValue("event", event).Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	pending := func(stream string) int64 {
		t.Helper()
		n, err := rc.Do(ctx, rc.B().Xpending().Key(stream).Group(group).Build()).ToArray()
		if err != nil {
			return -1 // the Worker has not created the group yet
		}
		count, _ := n[0].AsInt64()
		return count
	}
	// The Worker creates each group from id 0, so entries published before
	// it starts are delivered too.
	signup := publish(signups, `{"type":"signup","email":"ada@example.com"}`)
	other := publish(signups, `{"type":"signup","email":"bob@elsewhere.org"}`)
	order := publish(orders, `{"type":"order","total":42}`)

	for _, want := range []string{
		`msg="sending welcome mail" message_id=` + signup,
		`msg="recording order" message_id=` + order,
		`msg="writing hourly report"`,
	} {
		testutil.WaitFor(t, 10*time.Second, want, func() bool { return strings.Contains(logs.String(), want) })
	}
	testutil.WaitFor(t, 10*time.Second, "every message to be acknowledged", func() bool {
		return pending(signups) == 0 && pending(orders) == 0
	})
	if strings.Contains(logs.String(), `msg="sending welcome mail" message_id=`+other) {
		t.Errorf("the handler ran for %s, whose email does not match:\n%s", other, logs.String())
	}
	// The state switches to retention right after the acknowledgement.
	for stream, id := range map[string]string{signups: signup, orders: order} {
		var st map[string]string
		testutil.WaitFor(t, 10*time.Second, id+"'s state to be retained", func() bool {
			var err error
			st, err = invocation.New(rc).Get(ctx, invocation.Key{Stream: stream, Group: group, MessageID: id})
			if err != nil {
				t.Fatal(err)
			}
			return st["__terminal"] == "1"
		})
		if st["shop/mail.welcome"] != "ok" && st["shop/orders.record"] != "ok" {
			t.Errorf("state of %s = %v, want its handler ok", id, st)
		}
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30s of cancellation")
	}
}
