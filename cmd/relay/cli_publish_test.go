package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
)

// publishFixture is a stream on the shared redis-server with the CLI's
// settings pointing at it.
type publishFixture struct {
	t      *testing.T
	rc     rueidis.Client
	stream string
}

func newPublishFixture(t *testing.T) *publishFixture {
	t.Helper()
	isolateEnv(t)
	f := &publishFixture{t: t, rc: redistest.Client(t), stream: redistest.Name(t, "events")}
	t.Setenv("REDIS_URI", redistest.Addr(t))
	t.Setenv("REDIS_STREAM", f.stream)
	return f
}

// events returns the "event" field of every entry, and every entry's ids.
func (f *publishFixture) entries() (ids []string, events []string, traces []string) {
	f.t.Helper()
	es, err := f.rc.Do(context.Background(), f.rc.B().Xrange().Key(f.stream).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, e := range es {
		ids = append(ids, e.ID)
		events = append(events, e.FieldValues["event"])
		traces = append(traces, e.FieldValues["traceparent"])
	}
	return ids, events, traces
}

func (f *publishFixture) file(content string) string {
	f.t.Helper()
	p := filepath.Join(f.t.TempDir(), "events.ndjson")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		f.t.Fatal(err)
	}
	return p
}

func TestCLIPublishInputForms(t *testing.T) {
	f := newPublishFixture(t)
	ndjson := f.file("{\"n\":1}\n\n  {\"n\":2}  \n{\"n\":3}")
	runs := []struct {
		stdin string
		args  []string
		want  []string
	}{
		{args: []string{"publish", `{"type":"orders.placed"}`}, want: []string{`{"type":"orders.placed"}`}},
		{stdin: "{\n  \"type\": \"pretty\"\n}\n", args: []string{"publish"}, want: []string{"{\n  \"type\": \"pretty\"\n}"}},
		{args: []string{"publish", "--file", ndjson}, want: []string{`{"n":1}`, `{"n":2}`, `{"n":3}`}},
		{stdin: "{\"l\":1}\n{\"l\":2}\n", args: []string{"publish", "-f", "-"}, want: []string{`{"l":1}`, `{"l":2}`}},
		{stdin: "\xef\xbb\xbf{\"bom\":1}\n", args: []string{"publish", "-f", "-"}, want: []string{`{"bom":1}`}},
		{args: []string{"publish", "--count", "3", "--rate", "1000", `{"c":1}`}, want: []string{`{"c":1}`, `{"c":1}`, `{"c":1}`}},
	}
	var want []string
	printed := 0
	for _, r := range runs {
		res := relayCLI(t, r.stdin, r.args...)
		if res.code != exitOK {
			t.Fatalf("%s: exit %d, stderr %s", strings.Join(r.args, " "), res.code, res.stderr)
		}
		lines := strings.Fields(res.stdout)
		if len(lines) != len(r.want) {
			t.Errorf("%s printed %q, want %d ids", strings.Join(r.args, " "), res.stdout, len(r.want))
		}
		printed += len(lines)
		want = append(want, r.want...)
	}
	ids, events, _ := f.entries()
	if strings.Join(events, "|") != strings.Join(want, "|") {
		t.Errorf("stream holds %q, want %q", events, want)
	}
	if len(ids) != printed {
		t.Errorf("%d entries, %d ids printed", len(ids), printed)
	}
}

func TestCLIPublishBadInputWritesNothing(t *testing.T) {
	f := newPublishFixture(t)
	bad := f.file("{\"n\":1}\n{\"n\":2}\n{\"n\":\n{\"n\":4}\n")
	for _, tc := range []struct {
		stdin string
		args  []string
		code  int
		want  string
	}{
		{args: []string{"publish", `{"a":`}, code: exitFailure, want: "the argument: producer: invalid event: not valid JSON"},
		{args: []string{"publish", `[1]`}, code: exitFailure, want: "want a JSON object, got an array"},
		{args: []string{"publish", "--file", bad}, code: exitFailure, want: bad + ":3: producer: invalid event: not valid JSON"},
		{stdin: "{\"a\":1}\nnope\n", args: []string{"publish", "-f", "-"}, code: exitFailure, want: "stdin:2: "},
		{stdin: "\"text\"", args: []string{"publish"}, code: exitFailure, want: "stdin: producer: invalid event: want a JSON object, got a string"},
		{args: []string{"publish", "--file", f.file("\n\n")}, code: exitUsage, want: "holds no event"},
		{stdin: " \n", args: []string{"publish"}, code: exitUsage, want: "stdin holds no event"},
		{args: []string{"publish", "--count", "0", `{}`}, code: exitUsage, want: "--count must be at least 1"},
		{args: []string{"publish", "--rate=-1", `{}`}, code: exitUsage, want: "--rate must be >= 0"},
		{args: []string{"publish", "--trace", "00-nope", `{}`}, code: exitUsage, want: "is not a W3C traceparent"},
		{args: []string{"publish", "--file", bad, `{}`}, code: exitUsage, want: "not both"},
		{args: []string{"publish", "--max-event-bytes", "1KiB", `{"pad":"` + strings.Repeat("x", 1100) + `"}`}, code: exitFailure, want: "larger than the workers' limit of 1024 (MAX_EVENT_BYTES)"},
	} {
		res := relayCLI(t, tc.stdin, tc.args...)
		if res.code != tc.code || !strings.Contains(res.stderr, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d saying %q", strings.Join(tc.args, " "), res.code, res.stderr, tc.code, tc.want)
		}
		if res.code != exitOK && res.stdout != "" {
			t.Errorf("%s printed ids %q although it failed", strings.Join(tc.args, " "), res.stdout)
		}
	}
	if ids, _, _ := f.entries(); len(ids) != 0 {
		t.Errorf("%d entries written by refused publishes, want none", len(ids))
	}
}

func TestCLIPublishTrace(t *testing.T) {
	f := newPublishFixture(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if r := relayCLI(t, "", "publish", "--trace", tp, `{"a":1}`); r.code != exitOK {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	t.Setenv("TRACEPARENT", tp)
	if r := relayCLI(t, "", "publish", `{"a":2}`); r.code != exitOK {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if _, _, traces := f.entries(); len(traces) != 2 || traces[0] != tp || traces[1] != tp {
		t.Errorf("traceparents %q, want %s twice", traces, tp)
	}
}

func TestCLIPublishNeedsTheStream(t *testing.T) {
	isolateEnv(t)
	r := relayCLI(t, "", "publish", `{}`)
	if r.code != exitUsage || !strings.Contains(r.stderr, "REDIS_URI") || !strings.Contains(r.stderr, "REDIS_STREAM") {
		t.Errorf("exit %d, stderr %q; want a usage error naming REDIS_URI and REDIS_STREAM", r.code, r.stderr)
	}
}

// TestCLIPublishSaysWhereItStopped: Redis gone midway, relay publish
// prints the ids it wrote and says how many and which event is next.
func TestCLIPublishSaysWhereItStopped(t *testing.T) {
	isolateEnv(t)
	srv := redistest.Start(t, redistest.Options{})
	t.Setenv("REDIS_URI", srv.Addr)
	t.Setenv("REDIS_STREAM", "events")
	go func() {
		time.Sleep(500 * time.Millisecond)
		srv.Kill()
	}()
	r := relayCLI(t, "", "publish", "--count", "200", "--rate", "40", `{"n":1}`)
	printed := len(strings.Fields(r.stdout))
	want := fmt.Sprintf("published %d of 200 (the ids above), the next is event 1 of pass %d", printed, printed+1)
	if r.code != exitFailure || printed == 0 || printed == 200 || !strings.Contains(r.stderr, want) {
		t.Errorf("exit %d, %d ids, stderr %q; want exit 1 saying %q", r.code, printed, r.stderr, want)
	}
}
