package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/runtime"
)

const handlerScript = `#!/bin/sh
case "$RELAY_HANDLER" in
events.created)
	echo "welcome $(cat)"
	echo "app=$RELAY_APP id=$RELAY_MESSAGE_ID attempt=$RELAY_ATTEMPT greeting=$GREETING trace=$TRACEPARENT"
	echo "to stderr" >&2
	printf 'no newline'
	;;
env.pwd) pwd ;;
fail.exit) echo "bad input" >&2; exit 3 ;;
fail.permanent) echo "order 7 does not exist" >&2; exit 65 ;;
slow.sleep) sleep 30 & sleep 30 ;;
self.kill) kill -TERM $$ ;;
*) echo "unknown handler $RELAY_HANDLER" >&2; exit 127 ;;
esac
`

func newProcess(t *testing.T) (*runtime.Process, *bytes.Buffer, string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "handler.sh"), []byte(handlerScript), 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	p, err := runtime.NewProcess(runtime.WithOutput(&out, &out), runtime.WithBaseEnv([]string{"PATH=/usr/bin:/bin"}))
	if err != nil {
		t.Fatal(err)
	}
	return p, &out, dir
}

func processRequest(dir, handler string) runtime.Request {
	return runtime.Request{
		App: "users", Handler: handler, MessageID: "1700000000000-0", Attempt: 2,
		Event:   []byte(`{"id":42}`),
		Timeout: 10 * time.Second,
		Env:     map[string]string{"TRACEPARENT": "00-t-s-01"},
		Spec: runtime.Spec{
			Dir:     dir,
			Command: []string{"/bin/sh", "/app/handler.sh"},
			Env:     map[string]string{"GREETING": "hello"},
		},
	}
}

func TestProcessSuccess(t *testing.T) {
	p, out, dir := newProcess(t)
	res, err := p.Run(t.Context(), processRequest(dir, "events.created"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Duration <= 0 {
		t.Errorf("Duration = %v", res.Duration)
	}
	for _, want := range []string{
		"[users/events.created] welcome {\"id\":42}\n",
		"[users/events.created] app=users id=1700000000000-0 attempt=2 greeting=hello trace=00-t-s-01\n",
		"[users/events.created] to stderr\n",
		"[users/events.created] no newline\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestProcessWorkingDir(t *testing.T) {
	p, out, dir := newProcess(t)
	if _, err := p.Run(t.Context(), processRequest(dir, "env.pwd")); err != nil {
		t.Fatal(err)
	}
	real, _ := filepath.EvalSymlinks(dir)
	if got := strings.TrimSpace(strings.TrimPrefix(out.String(), "[users/env.pwd] ")); got != dir && got != real {
		t.Errorf("pwd = %q, want %q", got, dir)
	}
}

func TestProcessExitCode(t *testing.T) {
	p, out, dir := newProcess(t)
	_, err := p.Run(t.Context(), processRequest(dir, "fail.exit"))
	if ee := asExit(t, err); ee.Code != 3 || ee.TimedOut || ee.IsPermanent() {
		t.Errorf("got %#v, want code 3, not permanent", ee)
	}
	_, err = p.Run(t.Context(), processRequest(dir, "fail.permanent"))
	if ee := asExit(t, err); !ee.IsPermanent() || ee.Stderr != "order 7 does not exist" {
		t.Errorf("exit 65: got %#v, want a permanent failure with its stderr line", ee)
	}
	if !strings.Contains(out.String(), "[users/fail.exit] bad input\n") {
		t.Errorf("stderr not forwarded:\n%s", out)
	}

	_, err = p.Run(t.Context(), processRequest(dir, "self.kill"))
	if ee := asExit(t, err); ee.Code != 128+15 {
		t.Errorf("killed by SIGTERM: got code %d, want 143", ee.Code)
	}
}

func TestProcessTimeout(t *testing.T) {
	p, _, dir := newProcess(t)
	req := processRequest(dir, "slow.sleep")
	req.Timeout = 300 * time.Millisecond
	start := time.Now()
	res, err := p.Run(t.Context(), req)
	if ee := asExit(t, err); !ee.TimedOut || ee.Code != 128+9 {
		t.Errorf("got %#v, want TimedOut with code 137", ee)
	}
	// The background sleep holds stdout open; only killing the whole process
	// group (not just the shell) lets Run return before the wait delay.
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("Run took %v after a 300ms timeout", el)
	}
	_ = res
}

func TestProcessCancel(t *testing.T) {
	p, _, dir := newProcess(t)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := p.Run(ctx, processRequest(dir, "slow.sleep"))
	if _, ok := errors.AsType[*runtime.ExitError](err); ok || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want an infrastructure error wrapping ctx.Err()", err)
	}
}

func TestProcessCannotRun(t *testing.T) {
	p, _, dir := newProcess(t)

	req := processRequest(dir, "events.created")
	req.Spec.Command = []string{"/app/missing.sh"}
	_, err := p.Run(t.Context(), req)
	if ee := asExit(t, err); ee.Code != 127 {
		t.Errorf("missing command: got %#v, want code 127", ee)
	}

	os.WriteFile(filepath.Join(dir, "noexec.sh"), []byte("#!/bin/sh\n"), 0o644)
	req.Spec.Command = []string{"/app/noexec.sh"}
	_, err = p.Run(t.Context(), req)
	if ee := asExit(t, err); ee.Code != 126 {
		t.Errorf("not executable: got %#v, want code 126", ee)
	}

	req = processRequest(filepath.Join(dir, "gone"), "events.created")
	if _, err := p.Run(t.Context(), req); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("missing app dir: got %v, want ErrUnavailable", err)
	}

	req = processRequest(dir, "events.created")
	req.Spec.Command = nil
	if _, err := p.Run(t.Context(), req); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("no command: got %v, want ErrUnavailable", err)
	}
}

func TestProcessBootstrap(t *testing.T) {
	tests := []struct {
		runtime, file, source string
	}{
		{"python3", "events.py", "def created(event):\n    print('py welcome', event['id'])\n\ndef failed(event):\n    raise ValueError('nope')\n"},
		{"node", "events.js", "exports.created = async (event) => { console.log('js welcome', event.id); };\nexports.failed = (event) => { throw new Error('nope'); };\n"},
	}
	for _, tt := range tests {
		t.Run(tt.runtime, func(t *testing.T) {
			if _, err := exec.LookPath(tt.runtime); err != nil {
				t.Skipf("%s not installed", tt.runtime)
			}
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, tt.file), []byte(tt.source), 0o644)
			var out bytes.Buffer
			p, err := runtime.NewProcess(runtime.WithOutput(&out, &out))
			if err != nil {
				t.Fatal(err)
			}
			req := runtime.Request{App: "users", Handler: "events.created", Event: []byte(`{"id":7}`), Timeout: 20 * time.Second,
				Spec: runtime.Spec{Dir: dir, Runtime: tt.runtime}}
			if _, err := p.Run(t.Context(), req); err != nil {
				t.Fatalf("%v\n%s", err, &out)
			}
			if !strings.Contains(out.String(), "welcome 7") {
				t.Errorf("output:\n%s", &out)
			}
			req.Handler = "events.failed"
			_, err = p.Run(t.Context(), req)
			if ee := asExit(t, err); ee.Code == 0 {
				t.Errorf("uncaught exception: got %#v", ee)
			}
			if !strings.Contains(out.String(), "nope") {
				t.Errorf("exception not on stderr:\n%s", &out)
			}
		})
	}
}

// stoppedLater is a context whose cancellation its children never see:
// Err reports Canceled from the start, as Run's context does when a
// shutdown follows the handler's timeout while the kill is under way.
type stoppedLater struct{ context.Context }

func (stoppedLater) Done() <-chan struct{} { return nil }
func (stoppedLater) Err() error            { return context.Canceled }

// A handler killed at its timeout timed out, even when a shutdown cancels
// the run's context before Run returns: the attempt is charged, never
// given back (docs/embedding.md#go-handlers).
func TestProcessTimeoutThenShutdown(t *testing.T) {
	p, _, dir := newProcess(t)
	req := processRequest(dir, "slow.sleep")
	req.Timeout = 100 * time.Millisecond
	_, err := p.Run(stoppedLater{t.Context()}, req)
	if ee, ok := errors.AsType[*runtime.ExitError](err); !ok || !ee.TimedOut {
		t.Errorf("got %v, want a timed-out *ExitError", err)
	}
}
