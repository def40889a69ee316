package producer_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/producer"
)

// docBlock returns the body of the first ```lang fence of docs/producing.md.
func docBlock(t *testing.T, lang string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "producing.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```" + lang + "\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatalf("docs/producing.md has no ```%s block", lang)
	}
	return string(m[1])
}

// requireTool skips, or fails under RELAY_TEST_REQUIRE, when check fails.
func requireTool(t *testing.T, what string, check *exec.Cmd) {
	t.Helper()
	if out, err := check.CombinedOutput(); err != nil {
		msg := what + " is not installed (scripts/setup.sh installs it): " + strings.TrimSpace(string(out))
		if os.Getenv("RELAY_TEST_REQUIRE") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// TestDocsProducersWriteWhatTheGoProducerWrites runs the Python and Node.js
// examples of docs/producing.md against a real Redis and compares their
// entries with the Go producer's for the same event.
func TestDocsProducersWriteWhatTheGoProducerWrites(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	nodeEnv := "NODE_PATH=/usr/share/nodejs" // where Debian's node-redis lives
	for _, tc := range []struct {
		lang  string
		check *exec.Cmd
		run   func(src string) *exec.Cmd
	}{
		{"python", exec.Command("/usr/bin/python3", "-c", "import redis"),
			func(src string) *exec.Cmd { return exec.Command("/usr/bin/python3", "-c", src) }},
		{"js", exec.Command("node", "-e", "require('redis')"),
			func(src string) *exec.Cmd { return exec.Command("node", "-e", src) }},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			tc.check.Env = append(os.Environ(), nodeEnv)
			requireTool(t, "the "+tc.lang+" Redis client", tc.check)
			c := redistest.Client(t)
			stream := redistest.Name(t, "events")
			cmd := tc.run(docBlock(t, tc.lang))
			cmd.Env = append(os.Environ(), nodeEnv, "REDIS_URI=redis://"+redistest.Addr(t), "REDIS_STREAM="+stream, "TRACEPARENT="+tp)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("the %s example failed: %v\n%s", tc.lang, err, stderr.String())
			}
			// The Go producer writes the same event into a second stream.
			goStream := stream + "-go"
			p, err := producer.New(producer.Redis(c, goStream))
			if err != nil {
				t.Fatal(err)
			}
			type order struct {
				Type    string `json:"type"`
				OrderID int    `json:"order_id"`
				Amount  int    `json:"amount"`
			}
			ctx := context.Background()
			if _, err := p.Publish(traceCtx(t, tp), order{"orders.placed", 7, 42}); err != nil {
				t.Fatal(err)
			}
			got, want := onlyEntry(t, ctx, c, stream), onlyEntry(t, ctx, c, goStream)
			if strings.TrimSpace(string(out)) != got.ID {
				t.Errorf("the example printed %q, its entry is %s", out, got.ID)
			}
			if !reflect.DeepEqual(keys(got.FieldValues), keys(want.FieldValues)) {
				t.Errorf("fields %v, the Go producer writes %v", keys(got.FieldValues), keys(want.FieldValues))
			}
			if got.FieldValues["traceparent"] != tp {
				t.Errorf("traceparent %q, want %s", got.FieldValues["traceparent"], tp)
			}
			ge, err1 := matcher.DecodeEvent([]byte(got.FieldValues["event"]))
			we, err2 := matcher.DecodeEvent([]byte(want.FieldValues["event"]))
			if err1 != nil || err2 != nil || !reflect.DeepEqual(ge, we) {
				t.Errorf("event %s (%v), the Go producer's %s (%v)", got.FieldValues["event"], err1, want.FieldValues["event"], err2)
			}
		})
	}
}
