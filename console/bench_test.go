package console_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

// Sizes of the large-data benchmark (docs/console.md#scale).
const (
	benchDLQ     = 1_000_000
	benchPending = 100_000
	benchBatch   = 5_000
)

// BenchmarkPages measures every page against a private redis-server
// holding 1,000,000 dead-letter entries and 100,000 pending messages
// (each with its invocation state), as the console serves them. Filling
// Redis takes a while; the numbers are in docs/console.md.
//
//	go test -run '^$' -bench Pages -benchtime 50x ./console/
func BenchmarkPages(b *testing.B) {
	rc := redistest.Connect(b, redistest.Start(b, redistest.Options{}).Addr)
	ctx := b.Context()
	const streamName, group = "events", "shop"
	start := time.Now()
	dlqKey := keys.DLQ(streamName)
	event := `{"event_name":"INSERT","table_name":"invoices","new_image":{"id":%d,"amount":120,"customer":"c-%d"}}`
	var mid string
	for i := 0; i < benchDLQ; i += benchBatch {
		cmds := make(rueidis.Commands, 0, benchBatch)
		for j := i; j < i+benchBatch; j++ {
			app, handler := "billing", "invoices.charge"
			if j%10 == 0 {
				handler = "invoices.refund"
			}
			cmds = append(cmds, rc.B().Xadd().Key(dlqKey).Id("*").FieldValue().
				FieldValue("original_stream", streamName).FieldValue("original_id", strconv.Itoa(j+1)+"-0").
				FieldValue("group", group).FieldValue("consumer", "worker-1").
				FieldValue("event", fmt.Sprintf(event, j, j%977)).
				FieldValue("reason", "handler exited with code 3: billing: payment provider unreachable").
				FieldValue("app", app).FieldValue("handler", handler).FieldValue("deliveries", "1").
				FieldValue("handler_attempts", "1").FieldValue("timestamp", time.Now().UTC().Format(time.RFC3339Nano)).Build())
		}
		for k, r := range rc.DoMulti(ctx, cmds...) {
			id, err := r.ToString()
			if err != nil {
				b.Fatal(err)
			}
			if i+k == benchDLQ/2 {
				mid = id
			}
		}
	}
	if err := rc.Do(ctx, rc.B().XgroupCreate().Key(streamName).Group(group).Id("0").Mkstream().Build()).Error(); err != nil {
		b.Fatal(err)
	}
	var midPending string
	for i := 0; i < benchPending; i += benchBatch {
		cmds := make(rueidis.Commands, 0, benchBatch)
		for j := i; j < i+benchBatch; j++ {
			cmds = append(cmds, rc.B().Xadd().Key(streamName).Id("*").FieldValue().FieldValue("event", fmt.Sprintf(event, j, j)).Build())
		}
		for _, r := range rc.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				b.Fatal(err)
			}
		}
		msgs, err := rc.Do(ctx, rc.B().Xreadgroup().Group(group, "worker-"+strconv.Itoa(i/20000)).Count(benchBatch).Streams().Key(streamName).Id(">").Build()).AsXRead()
		if err != nil {
			b.Fatal(err)
		}
		cmds = cmds[:0]
		deadline := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
		for k, m := range msgs[streamName] {
			cmds = append(cmds, rc.B().Hset().Key(keys.Invocation(streamName, group, m.ID)).FieldValue().
				FieldValue("billing/invoices.charge", "running:"+deadline+":1:tok").Build())
			if i+k == benchPending/2 {
				midPending = m.ID
			}
		}
		for _, r := range rc.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				b.Fatal(err)
			}
		}
	}
	rec := redisstats.NewRecorder(rc, streamName, group)
	for i := range stats.FeedBurst {
		rec.Add(stats.Received)
		rec.Record(stats.Event{Time: time.Now(), MessageID: strconv.Itoa(i) + "-0", App: "billing", Handler: "invoices.charge", Outcome: "failed", Reason: "exit 3"})
	}
	if err := rec.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	b.Logf("filled %d dead letters and %d pending messages in %s", benchDLQ, benchPending, time.Since(start).Round(time.Second))

	apps := testutil.AppsRoot(b, map[string]string{"billing": `image: relay.local/busybox:latest
command: ["/bin/sh", "/app/handler.sh"]
events:
  - handler: invoices.charge
    pattern: {table_name: [invoices], event_name: [INSERT]}
    retries: 2
  - handler: invoices.refund
    pattern: {table_name: [invoices], event_name: [DELETE]}
`})
	srv, err := console.New(console.Config{Redis: rc, Streams: []string{streamName}, Group: group, Apps: template.Dir(apps),
		DLQRetention: 336 * time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	firstEntry, err := redisdlq.NewStore(rc, streamName).Page(ctx, dlq.PageQuery{Count: 1})
	if err != nil {
		b.Fatal(err)
	}
	s := "&stream=" + streamName
	for _, bc := range []struct{ name, path string }{
		{"overview", "/"},
		{"apps", "/apps"},
		{"pending", "/pending?x=1" + s},
		{"pending_middle", "/pending?after=" + midPending + s},
		{"event", "/event?id=" + midPending + s},
		{"dlq", "/dlq?x=1" + s},
		{"dlq_middle", "/dlq?after=" + mid + s},
		{"dlq_filter_rare", "/dlq?handler=invoices.refund" + s},
		{"dlq_filter_none", "/dlq?app=nobody" + s},
		{"dlq_reason", "/dlq?reason=" + url.QueryEscape("no such text") + s},
		{"dlq_last", "/dlq?last=1" + s},
		{"dlq_text", "/dlq?text=" + url.QueryEscape(`"customer":"c-976"`) + s},
		{"dlq_entry", "/dlq/entry?id=" + firstEntry.Entries[0].ID + s},
		{"playground", "/playground?dlq=" + firstEntry.Entries[0].ID + s},
		{"live", "/live?x=1" + s},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				w := httptest.NewRecorder()
				srv.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://127.0.0.1"+bc.path, nil))
				if w.Code != http.StatusOK {
					b.Fatalf("%s: status %d: %s", bc.path, w.Code, w.Body.String())
				}
			}
		})
	}
}
