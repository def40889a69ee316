package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/runtime"
)

var (
	_ relay.Runner = (*runtime.Func)(nil)
	_ relay.Runner = (*runtime.Process)(nil)
)

func ExampleNewFunc() {
	f := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"users/events.created": func(ctx context.Context, req runtime.Request) error {
			fmt.Printf("welcome %s (attempt %d)\n", req.Event, req.Attempt)
			return nil
		},
		"billing/invoices.charge": func(ctx context.Context, req runtime.Request) error {
			return errors.New("payment provider unreachable")
		},
	})
	ctx := context.Background()
	_, err := f.Run(ctx, runtime.Request{App: "users", Handler: "events.created", Event: []byte(`{"id":7}`), Attempt: 1, Timeout: time.Second})
	fmt.Println(err)
	_, err = f.Run(ctx, runtime.Request{App: "billing", Handler: "invoices.charge", Timeout: time.Second})
	var ee *runtime.ExitError
	fmt.Println(errors.As(err, &ee), ee.Code, err)
	// Output:
	// welcome {"id":7} (attempt 1)
	// <nil>
	// true 1 handler failed: payment provider unreachable
}

func ExampleNewLineWriter() {
	out := runtime.NewOutput(os.Stdout) // share it between handlers
	lw := out.LineWriter(runtime.Prefix("users", "events.created"))
	fmt.Fprint(lw, "first line\nsecond ")
	fmt.Fprint(lw, "line\nno newline at the end")
	lw.Close()
	// Output:
	// [users/events.created] first line
	// [users/events.created] second line
	// [users/events.created] no newline at the end
}

func ExampleProcess() {
	dir, _ := os.MkdirTemp("", "app")
	defer os.RemoveAll(dir)
	os.WriteFile(dir+"/handler.sh", []byte(`echo "$RELAY_HANDLER got $(cat)"`), 0o644)

	p, _ := runtime.NewProcess(runtime.WithOutput(os.Stdout, os.Stdout))
	_, err := p.Run(context.Background(), runtime.Request{
		App: "users", Handler: "events.created", Event: []byte(`{"id":7}`), Timeout: 5 * time.Second,
		Spec: runtime.Spec{Dir: dir, Command: []string{"/bin/sh", "/app/handler.sh"}},
	})
	fmt.Println(strings.TrimSpace(fmt.Sprint(err)))
	// Output:
	// [users/events.created] events.created got {"id":7}
	// <nil>
}
