package redisdlq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/relaydev/relay/app"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/manual"
	"github.com/relaydev/relay/matcher/yamlpattern"
	"github.com/relaydev/relay/runtime"
)

// Read the dead-letter queue of a stream, then replay an entry once its
// handler is fixed: relay dlq ls and relay dlq replay in Go.
func ExampleStore_List() {
	client, stream, cleanup := exampleRedis()
	defer cleanup()
	ctx := context.Background()

	// Two dead letters as an Engine writes them: an invocation that used up
	// its attempts, and a message that was not a JSON object.
	w := redisdlq.NewWriter(client, stream)
	for _, e := range []dlq.Entry{
		{OriginalID: "1700000000000-0", Group: "workers", Consumer: "host-1", Event: `{"invoice":7}`,
			Reason: "handler exited with code 3: payment provider unreachable", App: "billing", Handler: "invoices.charge",
			Deliveries: 4, HandlerAttempts: 3},
		{OriginalID: "1700000000001-0", Group: "workers", Consumer: "host-1", Event: `[7]`,
			Reason: "malformed event: want a JSON object, got an array", App: dlq.MalformedName, Handler: dlq.MalformedName},
	} {
		if _, err := w.Write(ctx, e); err != nil {
			fmt.Println(err)
			return
		}
	}

	store := redisdlq.NewStore(client, stream)
	entries, err := store.List(ctx, dlq.Filter{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range entries {
		fmt.Printf("%s/%s  attempts=%d  event=%s  reason=%s\n", e.App, e.Handler, e.HandlerAttempts, e.Event, e.Reason)
	}

	// Replay runs the recorded handler once more with the stored event,
	// and deletes the entry when it succeeds.
	pattern, err := yamlpattern.Parse("billing", []byte(`{invoice: [{exists: true}]}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	apps, err := app.NewSet(&app.App{Name: "billing", Rules: []app.Rule{{Handler: "invoices.charge", Pattern: pattern}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"billing/invoices.charge": func(ctx context.Context, req runtime.Request) error {
			fmt.Printf("charging %s (message %s, attempt %d)\n", req.Event, req.MessageID, req.Attempt)
			return nil
		},
	})
	for _, e := range entries {
		switch err := (manual.Invoker{Runner: runner}).Replay(ctx, apps, store, e.ID); {
		case err == nil:
			fmt.Printf("replayed %s/%s; its entry is deleted\n", e.App, e.Handler)
		case errors.Is(err, manual.ErrReplayMalformed):
			fmt.Println("a malformed message has no handler to replay; its entry stays")
		default:
			fmt.Println(err)
		}
	}
	n, err := store.Len(ctx)
	fmt.Println("entries left:", n, err)
	// Output:
	// billing/invoices.charge  attempts=3  event={"invoice":7}  reason=handler exited with code 3: payment provider unreachable
	// -/-  attempts=0  event=[7]  reason=malformed event: want a JSON object, got an array
	// charging {"invoice":7} (message 1700000000000-0, attempt 4)
	// replayed billing/invoices.charge; its entry is deleted
	// a malformed message has no handler to replay; its entry stays
	// entries left: 1 <nil>
}

// exampleRedis returns a client of the test binary's shared redis-server
// (internal/redistest) and a stream name of the example's own. An Example
// has no *testing.T, so exampleTB stands in for one; an Example cannot be
// skipped either, so without redis-server it fails, naming why.
func exampleRedis() (rueidis.Client, string, func()) {
	tb := &exampleTB{}
	return redistest.Client(tb), redistest.Name(tb, "events"), tb.cleanup
}

// exampleTB implements the part of testing.TB that internal/redistest
// uses. The embedded testing.TB is nil: calling any other method panics.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (*exampleTB) Helper()            {}
func (*exampleTB) Name() string       { return "Example" }
func (e *exampleTB) Cleanup(f func()) { e.cleanups = append(e.cleanups, f) }

func (*exampleTB) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

func (*exampleTB) Skipf(format string, args ...any) {
	panic("an Example cannot be skipped: " + fmt.Sprintf(format, args...))
}

func (e *exampleTB) cleanup() {
	for _, f := range slices.Backward(e.cleanups) {
		f()
	}
}
