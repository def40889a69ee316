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

// TestRun runs the example's Engine on a private redis-server: a matching
// signup reaches the Go handler and is acknowledged with its state
// retained; an event the rule does not match is acknowledged without
// running anything; cancelling the context stops the Engine cleanly.
func TestRun(t *testing.T) {
	rc := redistest.Client(t)
	streamName, group := redistest.Name(t, "events"), "embed"
	logs := &testutil.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- run(ctx, rc, streamName, group, "test-host", log) }()

	publish := func(event string) string {
		t.Helper()
		id, err := rc.Do(ctx, rc.B().Xadd().Key(streamName).Id("*").FieldValue().FieldValue("event", event).Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	pending := func() int64 {
		t.Helper()
		n, err := rc.Do(ctx, rc.B().Xpending().Key(streamName).Group(group).Build()).ToArray()
		if err != nil {
			return -1 // the Engine has not created the group yet
		}
		count, _ := n[0].AsInt64()
		return count
	}
	// The Engine creates the group from id 0, so entries published before
	// it starts are delivered too.
	signup := publish(`{"type":"signup","email":"ada@example.com"}`)
	other := publish(`{"type":"signup","email":"bob@elsewhere.org"}`)

	testutil.WaitFor(t, 10*time.Second, "the welcome mail", func() bool {
		return strings.Contains(logs.String(), `msg="sending welcome mail" message_id=`+signup)
	})
	testutil.WaitFor(t, 10*time.Second, "both messages to be acknowledged", func() bool { return pending() == 0 })
	if strings.Contains(logs.String(), `msg="sending welcome mail" message_id=`+other) {
		t.Errorf("the handler ran for %s, whose email does not match:\n%s", other, logs.String())
	}
	// The state switches to retention right after the acknowledgement.
	var st map[string]string
	testutil.WaitFor(t, 10*time.Second, "the signup's state to be retained", func() bool {
		var err error
		st, err = invocation.New(rc).Get(ctx, invocation.Key{Stream: streamName, Group: group, MessageID: signup})
		if err != nil {
			t.Fatal(err)
		}
		return st["__terminal"] == "1"
	})
	if st["signups/mail.welcome"] != "ok" {
		t.Errorf("state of %s = %v, want ok", signup, st)
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
