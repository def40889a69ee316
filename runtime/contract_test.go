package runtime_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
)

// behaviourHandler names the handler of each relaytest.Behaviour.
var behaviourHandler = map[relaytest.Behaviour]string{
	relaytest.Succeeds:    "succeeds",
	relaytest.Fails:       "fails",
	relaytest.Hangs:       "hangs",
	relaytest.ChecksEvent: "checks.event",
}

// TestFuncContract runs the shared relay.Runner suite against Func.
func TestFuncContract(t *testing.T) {
	f := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"succeeds": func(context.Context, runtime.Request) error { return nil },
		"fails":    func(context.Context, runtime.Request) error { return errors.New("failed on purpose") },
		"hangs": func(ctx context.Context, _ runtime.Request) error {
			<-ctx.Done()
			return ctx.Err()
		},
		"checks.event": func(_ context.Context, req runtime.Request) error {
			if string(req.Event) != relaytest.CheckEvent {
				return errors.New("unexpected event: " + string(req.Event))
			}
			return nil
		},
	})
	relaytest.TestRunner(t, func(t *testing.T) relaytest.RunnerHarness {
		return relaytest.RunnerHarness{
			Runner: f,
			Request: func(_ *testing.T, b relaytest.Behaviour) runtime.Request {
				return runtime.Request{App: "contract", Handler: behaviourHandler[b]}
			},
		}
	})
}

// contractScript is one shell handler for every behaviour, selected by
// $RELAY_HANDLER as in the example apps.
const contractScript = `case "$RELAY_HANDLER" in
succeeds) exit 0 ;;
fails) echo "failed on purpose" >&2; exit 3 ;;
hangs) exec sleep 600 ;;
checks.event) [ "$(cat)" = "$EXPECTED_EVENT" ] ;;
*) exit 64 ;;
esac
`

// TestProcessContract runs the shared relay.Runner suite against Process,
// with /bin/sh handlers.
func TestProcessContract(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "handler.sh"), []byte(contractScript), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := runtime.NewProcess(runtime.WithOutput(discard{}, discard{}))
	if err != nil {
		t.Fatal(err)
	}
	relaytest.TestRunner(t, func(t *testing.T) relaytest.RunnerHarness {
		return relaytest.RunnerHarness{
			Runner: p,
			Request: func(_ *testing.T, b relaytest.Behaviour) runtime.Request {
				return runtime.Request{App: "contract", Handler: behaviourHandler[b], Spec: runtime.Spec{
					Dir: dir, Command: []string{"/bin/sh", "/app/handler.sh"},
					Env: map[string]string{"EXPECTED_EVENT": relaytest.CheckEvent},
				}}
			},
		}
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
