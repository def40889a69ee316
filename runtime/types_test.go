package runtime_test

import (
	"testing"
	"time"

	"github.com/relaydev/relay/runtime"
)

// TestExitErrorReasons: the reason of each kind of failure, as logs and
// DLQ entries show it, tells them apart.
func TestExitErrorReasons(t *testing.T) {
	for _, c := range []struct {
		err  runtime.ExitError
		want string
	}{
		{runtime.ExitError{Code: 3, Stderr: "cannot bill"}, "handler exited with code 3: cannot bill"},
		{runtime.ExitError{Code: 137}, "handler exited with code 137"},
		{runtime.ExitError{Code: 137, TimedOut: true, Timeout: 30 * time.Second}, "handler timed out after 30s (the rule's timeout)"},
		{runtime.ExitError{Code: 137, OOMKilled: true, MemoryLimit: 128 << 20, Stderr: "Killed"}, "handler killed: out of memory (limit 128MiB): Killed"},
		{runtime.ExitError{Code: 137, OOMKilled: true}, "handler killed: out of memory"},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("%+v: Error() = %q, want %q", c.err, got, c.want)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{
		128 << 20: "128MiB", 1 << 30: "1GiB", 1536 << 10: "1536KiB", 3 << 29: "1536MiB", 100: "100B", 0: "0B",
	} {
		if got := runtime.FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestSpecCommandLine(t *testing.T) {
	for _, c := range []struct {
		argv []string
		want string
	}{
		{nil, ""},
		{[]string{"/app/run.sh", "--fast"}, "/app/run.sh --fast"},
		{[]string{"sh", "-c", "echo $HOME"}, `sh -c "echo $HOME"`},
		{[]string{"printf", ""}, `printf ""`},
		{[]string{`a"b`, `c\d`}, `"a\"b" "c\\d"`},
	} {
		if got := (runtime.Spec{Command: c.argv}).CommandLine(); got != c.want {
			t.Errorf("CommandLine(%q) = %q, want %q", c.argv, got, c.want)
		}
	}
}
