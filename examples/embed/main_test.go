package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/producer"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
)

// TestOrders runs the service's template and handlers through a real
// relay.Engine on relaytest's in-memory fakes: no Redis, no containers.
// The synctest bubble lets the Engine's production timings (retries after
// 1m, 2m, ...) pass in virtual time.
func TestOrders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		apps, err := template.LoadFS(Apps, "apps") // the apps built into the binary
		if err != nil || len(apps.Errors()) > 0 {
			t.Fatalf("load apps: %v %v", err, apps.Errors())
		}
		src, outcomes := relaytest.NewStream(), &relaytest.Outcomes{}
		e, err := relay.NewEngine(apps, relay.Components{
			Source: src.Consumer("test"), Runner: runtime.NewFunc(Handlers),
			State:  relaytest.NewStateStore(relaytest.WithStream(src), relaytest.WithDLQ(relaytest.NewDLQ("orders"))),
			Stream: "orders", Group: "orders", Consumer: "test",
		}, relay.Config{OnOutcome: outcomes.Record, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err) // also when a handler of the template has no function
		}
		ctx, stop := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- e.Run(ctx) }()

		// The service's producer code, on the in-memory stream.
		p, err := producer.New(src)
		if err != nil {
			t.Fatal(err)
		}
		publish := func(event string) string {
			id, err := p.PublishJSON(ctx, []byte(event))
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		placed := publish(`{"type":"orders.placed","id":"o-1","total":200}`)
		small := publish(`{"type":"orders.charge","id":"o-1","total":200}`)
		large := publish(`{"type":"orders.charge","id":"o-2","total":1200}`)
		garbled := publish(`{"type":"orders.charge","id":"o-3","total":"lots"}`)
		if err := relaytest.WaitDrained(ctx, src); err != nil {
			t.Fatal(err)
		}
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}

		for _, c := range []struct {
			id, handler string
			kind        relay.OutcomeKind
			reason      string
		}{
			{placed, "orders.placed", relay.Succeeded, ""},
			{small, "orders.charge", relay.Succeeded, ""},
			// Permanent failures: one attempt, then the dead-letter queue.
			{large, "orders.charge", relay.DeadLettered, "total 1200 is above the limit of 1000"},
			{garbled, "orders.charge", relay.DeadLettered, "Order.total"},
		} {
			o, ok := outcomes.Final(c.id, "orders", c.handler)
			if !ok || o.Kind != c.kind || o.Attempt != 1 || !strings.Contains(o.Reason, c.reason) {
				t.Errorf("%s of %s: %+v, want %s after attempt 1 with a reason saying %q", c.handler, c.id, o, c.kind, c.reason)
			}
		}
	})
}
