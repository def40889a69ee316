package containerd

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/relaydev/relay/internal/testutil"
)

// TestBuildOutputCapped: a build's output is logged with the app's name up
// to buildLogLines lines of at most buildLineBytes, the rest counted, and
// the last buildTailLines lines are kept for the failure's reason.
func TestBuildOutputCapped(t *testing.T) {
	log := &testutil.Buffer{}
	o := newBuildOutput(slog.New(slog.NewTextHandler(log, nil)), "shop")
	for i := range 250 {
		fmt.Fprintf(o, "line %d\n", i)
	}
	fmt.Fprintf(o, "\n%s", strings.Repeat("x", 5000)) // a blank line, then a long unterminated one
	o.Close()
	s := log.String()
	if n := strings.Count(s, `msg="dependency build output" app=shop`); n != buildLogLines {
		t.Errorf("%d lines logged, want %d", n, buildLogLines)
	}
	if !strings.Contains(s, "lines_not_logged=51") {
		t.Errorf("no count of the lines not logged:\n%s", s[len(s)-300:])
	}
	tail := o.Tail()
	if parts := strings.Split(tail, " | "); len(parts) != buildTailLines || parts[0] != "line 241" || len(parts[len(parts)-1]) != buildLineBytes {
		t.Errorf("tail = %.200q... (%d parts)", tail, len(parts))
	}
}
