package relay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
)

func TestMatchedEventRunsAndIsAcked(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	h.start("c1")
	event := `{"event_name":"INSERT","table_name":"users","id":7}`
	id := h.publish("event", event)
	testutil.WaitFor(t, 5*time.Second, "ack", func() bool { return h.calls.Count("users/events.created") == 1 && h.settled() })

	req := h.calls.Get("users/events.created")[0]
	if string(req.Event) != event || req.MessageID != id || req.Attempt != 1 || req.Timeout != 5*time.Second {
		t.Errorf("request = %+v", req)
	}
	testutil.WaitFor(t, 2*time.Second, "retention", func() bool { return h.hash(id)["__terminal"] != "" })
	if got := h.hash(id)["users/events.created"]; got != "ok" {
		t.Errorf("state = %q, want ok", got)
	}
	if ttl := h.ttl(id); ttl <= relay.DefaultRetention-time.Minute || ttl > relay.DefaultRetention {
		t.Errorf("retention TTL = %s, want about %s", ttl, relay.DefaultRetention)
	}
	if n := h.counter("relay_events_matched_total"); n != 1 {
		t.Errorf("matched = %v", n)
	}
}

func TestUnmatchedIsAckedWithoutRun(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	h.start("c1")
	id := h.publish("event", `{"event_name":"DELETE","table_name":"users"}`)
	testutil.WaitFor(t, 5*time.Second, "unmatched counted", func() bool { return h.counter("relay_events_unmatched_total") == 1 })
	testutil.WaitFor(t, 2*time.Second, "ack", func() bool { return h.settled() })
	if n := h.calls.Count("users/events.created"); n != 0 {
		t.Errorf("handler ran %d times for an unmatched event", n)
	}
	if len(h.hash(id)) != 0 {
		t.Errorf("unmatched event left invocation state %v", h.hash(id))
	}
	if len(h.dlqEntries()) != 0 {
		t.Error("unmatched event was dead-lettered")
	}
}

func TestMalformedMessagesAreDeadLetteredOnceAndAcked(t *testing.T) {
	cases := map[string][]string{
		"no event field":   {"payload", `{"a":1}`},
		"json string":      {"event", `"INSERT"`},
		"json array":       {"event", `[{"event_name":"INSERT"}]`},
		"json number":      {"event", `42`},
		"not json":         {"event", `{event_name: INSERT}`},
		"trailing garbage": {"event", `{"event_name":"INSERT"} x`},
		"empty":            {"event", ``},
	}
	for name, fields := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, map[string]string{"users": usersApp})
			h.handle("users/events.created", nil)
			h.start("c1")
			id := h.publish(fields...)
			testutil.WaitFor(t, 5*time.Second, "dead letter and ack", func() bool { return len(h.dlqEntries()) == 1 && h.settled() })
			e := h.dlqEntries()[0]
			if e.App != "-" || e.Handler != "-" || e.HandlerAttempts != 0 || e.OriginalID != id ||
				e.OriginalStream != h.stream || e.Group != h.group || e.Consumer != "c1" || e.Reason == "" {
				t.Errorf("entry = %+v", e)
			}
			if fields[0] == "event" && e.Event != fields[1] {
				t.Errorf("entry event = %q, want the original %q", e.Event, fields[1])
			}
			if h.calls.Count("users/events.created") != 0 {
				t.Error("a handler ran for a malformed message")
			}
			if h.counter("relay_events_malformed_total") != 1 {
				t.Error("malformed not counted")
			}
			// Dead-lettered on first encounter: the entry was written by
			// the first delivery, not after a reclaim (MinPendingIdle is
			// 300ms).
			if e.Deliveries != 1 {
				t.Errorf("entry deliveries = %d, want 1 (first encounter)", e.Deliveries)
			}
			// Acked with state: the malformed marker is retained, not
			// leaked.
			testutil.WaitFor(t, 2*time.Second, "retention", func() bool { return h.hash(id)["__terminal"] != "" && h.ttl(id) > 0 })
		})
	}
	// Acked only after the DLQ entry is persisted: a failed write leaves
	// the message pending and a redelivery writes it.
	t.Run("DLQ write fails", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, map[string]string{"users": usersApp})
		h.handle("users/events.created", nil)
		// The DLQ is down for the first two deliveries: the third needs a
		// redelivery, which an ack after the first failure would have
		// prevented.
		failed := failDeadLetters(h, func(e dlq.Entry) bool { return e.Deliveries < 3 })
		h.start("c1", writeTimeout(200*time.Millisecond))
		id := h.publish("event", `not json`)
		testutil.WaitFor(t, 5*time.Second, "failed writes", func() bool { return failed.Load() >= 2 })
		testutil.WaitFor(t, 5*time.Second, "written, then acked", func() bool { return len(h.dlqEntries()) == 1 && h.settled() })
		if e := h.dlqEntries()[0]; e.OriginalID != id || e.App != "-" || e.Deliveries < 3 {
			t.Errorf("entry = %+v, want the message's, written on its 3rd delivery", e)
		}
		if h.calls.Count("users/events.created") != 0 {
			t.Error("a handler ran for a malformed message")
		}
	})
}

// docs/delivery.md#from-entry-to-acknowledgement: a malformed message is
// dead-lettered at its first handling even when that is a reclaim (the
// consumer that read it died first): one entry, then the ack.
func TestMalformedMessageFirstSeenOnReclaimIsDeadLettered(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	id := h.publish("event", `not json`)
	dead := redisstream.New(h.rc, h.stream, h.group, "dead", redisstream.WithBlock(50*time.Millisecond))
	if msgs, err := dead.Read(t.Context(), 10); err != nil || len(msgs) != 1 {
		t.Fatalf("read = %v, %v", msgs, err)
	}
	h.start("c1")
	testutil.WaitFor(t, 5*time.Second, "dead letter and ack", func() bool { return len(h.dlqEntries()) == 1 && h.settled() })
	e := h.dlqEntries()[0]
	if e.OriginalID != id || e.App != "-" || e.Handler != "-" || e.HandlerAttempts != 0 || e.Consumer != "c1" || e.Deliveries != 2 {
		t.Errorf("entry = %+v, want the malformed entry written by c1 on the message's 2nd delivery", e)
	}
	if h.calls.Count("users/events.created") != 0 {
		t.Error("a handler ran for a malformed message")
	}
}

func TestPerMessageInvocationsRunOneAtATimeAcrossMessagesConcurrently(t *testing.T) {
	h := newHarness(t, map[string]string{
		"a": "image: x\nconcurrency: 4\nevents:\n  - {handler: m.one, pattern: {k: [v]}}\n  - {handler: m.two, pattern: {k: [v]}}\n",
	})
	var mu sync.Mutex
	running := map[string]int{} // per message
	maxPerMsg, cur, maxAll := 0, 0, 0
	release := make(chan struct{})
	fn := func(_ context.Context, req runtime.Request) error {
		mu.Lock()
		running[req.MessageID]++
		cur++
		maxPerMsg = max(maxPerMsg, running[req.MessageID])
		maxAll = max(maxAll, cur)
		mu.Unlock()
		<-release
		mu.Lock()
		running[req.MessageID]--
		cur--
		mu.Unlock()
		return nil
	}
	h.handle("a/m.one", fn)
	h.handle("a/m.two", fn)
	h.start("c1")
	for range 3 {
		h.publish("event", `{"k":"v"}`)
	}
	testutil.WaitFor(t, 5*time.Second, "three messages running", func() bool { mu.Lock(); defer mu.Unlock(); return cur == 3 })
	close(release)
	testutil.WaitFor(t, 5*time.Second, "ack", func() bool { return h.settled() })
	if maxPerMsg != 1 {
		t.Errorf("a message ran %d invocations at once, want 1", maxPerMsg)
	}
	if maxAll != 3 {
		t.Errorf("max concurrent = %d, want 3 (one per message)", maxAll)
	}
}
