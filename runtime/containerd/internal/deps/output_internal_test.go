package deps

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

// TestBuildOutputReason: npm's pointer to a log inside the build container,
// removed with it, stays out of the failure's reason; output that says the
// index's certificate is not trusted gets the way to trust it.
func TestBuildOutputReason(t *testing.T) {
	o := newBuildOutput(slog.New(slog.NewTextHandler(&testutil.Buffer{}, nil)), "shop")
	fmt.Fprint(o, "npm ERR! code SELF_SIGNED_CERT_IN_CHAIN\nnpm ERR! A complete log of this run can be found in: /root/.npm/_logs/x.log\n")
	o.Close()
	if tail := o.Tail(); tail != "npm ERR! code SELF_SIGNED_CERT_IN_CHAIN" {
		t.Errorf("tail = %q, want the error line only", tail)
	}
	if h := tlsHint(o.Tail()); !strings.Contains(h, "RELAY_BUILD_CA_FILE") {
		t.Errorf("hint for an untrusted certificate = %q, want RELAY_BUILD_CA_FILE", h)
	}
	if h := tlsHint("ERROR: No matching distribution found for flask"); h != "" {
		t.Errorf("hint for another failure = %q, want none", h)
	}
}
