package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
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

// pttl returns the PTTL of key on the fixture's server (-2ms: no key).
func (f *publishFixture) pttl(key string) time.Duration {
	f.t.Helper()
	n, err := f.rc.Do(context.Background(), f.rc.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil {
		f.t.Fatal(err)
	}
	return time.Duration(n) * time.Millisecond
}

// TestCLIPublishIdempotencyKey: a second publish with the key adds nothing,
// prints the first id and says on stderr it was a duplicate; concurrent
// runs all print that one id; --idempotency-window sets the key's lifetime.
func TestCLIPublishIdempotencyKey(t *testing.T) {
	f := newPublishFixture(t)
	first := relayCLI(t, "", "publish", "--idempotency-key", "order-7", `{"n":1}`)
	if first.code != exitOK || first.stderr != "" || len(strings.Fields(first.stdout)) != 1 {
		t.Fatalf("first publish: exit %d, stdout %q, stderr %q", first.code, first.stdout, first.stderr)
	}
	again := relayCLI(t, "", "publish", "--idempotency-key", "order-7", `{"n":2}`)
	wantErr := `relay: duplicate: idempotency key "order-7" was published within the last 24h; nothing added, the id printed is the first publish's` + "\n"
	if again.code != exitOK || again.stdout != first.stdout || again.stderr != wantErr {
		t.Errorf("repeat: exit %d, stdout %q, stderr %q; want exit 0, the first id %q and stderr %q", again.code, again.stdout, again.stderr, first.stdout, wantErr)
	}
	// Concurrent runs of one new key: one entry, one id printed by all.
	runs := make([]cliRun, 8)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() { runs[i] = relayCLI(t, "", "publish", "--idempotency-key", "order-8", `{"n":3}`) })
	}
	wg.Wait()
	dups := 0
	for _, r := range runs {
		if r.code != exitOK || r.stdout != runs[0].stdout {
			t.Errorf("concurrent run: exit %d, stdout %q, stderr %q; want exit 0 and %q", r.code, r.stdout, r.stderr, runs[0].stdout)
		}
		if strings.Contains(r.stderr, "duplicate") {
			dups++
		}
	}
	if dups != len(runs)-1 {
		t.Errorf("%d of %d concurrent runs said duplicate, want all but one", dups, len(runs))
	}
	ids, events, _ := f.entries()
	if len(ids) != 2 || ids[0] != strings.TrimSpace(first.stdout) || events[0] != `{"n":1}` || ids[1] != strings.TrimSpace(runs[0].stdout) {
		t.Errorf("stream holds %v %q, want the first publish of each key", ids, events)
	}
	if ttl := f.pttl(keys.Idempotency(f.stream, "order-7")); ttl <= 23*time.Hour || ttl > 24*time.Hour {
		t.Errorf("dedup key TTL %s, want the default 24h window", ttl)
	}
	if r := relayCLI(t, "", "publish", "--idempotency-key", "k", "--idempotency-window", "90s", `{}`); r.code != exitOK {
		t.Fatalf("--idempotency-window 90s: exit %d: %s", r.code, r.stderr)
	}
	if ttl := f.pttl(keys.Idempotency(f.stream, "k")); ttl <= 0 || ttl > 90*time.Second {
		t.Errorf("dedup key TTL %s, want --idempotency-window 90s", ttl)
	}
}

// TestCLIPublishIdempotencyKeyFile: with --file the n-th event is keyed
// KEY:n, so the same file published again adds only the events it did not
// hold before, and stderr counts the duplicates.
func TestCLIPublishIdempotencyKeyFile(t *testing.T) {
	f := newPublishFixture(t)
	r1 := relayCLI(t, "", "publish", "--idempotency-key", "batch", "--file", f.file("{\"n\":1}\n\n{\"n\":2}\n{\"n\":3}\n"))
	if r1.code != exitOK || r1.stderr != "" || len(strings.Fields(r1.stdout)) != 3 {
		t.Fatalf("first run: exit %d, stdout %q, stderr %q", r1.code, r1.stdout, r1.stderr)
	}
	r2 := relayCLI(t, "", "publish", "--idempotency-key", "batch", "--file", f.file("{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n{\"n\":4}\n"))
	wantErr := `relay: 3 duplicates: idempotency keys "batch:1", "batch:2", "batch:3" were published within the last 24h; nothing added for them, the ids printed are the first publishes'` + "\n"
	printed := strings.Fields(r2.stdout)
	if r2.code != exitOK || r2.stderr != wantErr || len(printed) != 4 || strings.Join(printed[:3], " ") != strings.Join(strings.Fields(r1.stdout), " ") {
		t.Errorf("second run: exit %d, stdout %q, stderr %q; want the 3 first ids, a new one, and stderr %q", r2.code, r2.stdout, r2.stderr, wantErr)
	}
	ids, events, _ := f.entries()
	if strings.Join(events, "|") != `{"n":1}|{"n":2}|{"n":3}|{"n":4}` || strings.Join(ids, " ") != strings.Join(printed, " ") {
		t.Errorf("stream holds %v %q, want the four events once, as printed", ids, events)
	}
	if ttl := f.pttl(keys.Idempotency(f.stream, "batch:4")); ttl <= 0 {
		t.Errorf("no dedup key batch:4 (PTTL %s)", ttl)
	}
	// Many duplicates are counted, with the first few keys named.
	many := strings.Repeat("{\"n\":0}\n", 7)
	relayCLI(t, "", "publish", "--idempotency-key", "many", "--file", f.file(many))
	r3 := relayCLI(t, many, "publish", "--idempotency-key", "many", "-f", "-")
	if want := `"many:5" and 2 more were published`; r3.code != exitOK || !strings.HasPrefix(r3.stderr, "relay: 7 duplicates: ") || !strings.Contains(r3.stderr, want) {
		t.Errorf("stdin run: exit %d, stderr %q; want 7 duplicates saying %q", r3.code, r3.stderr, want)
	}
}

// TestCLIPublishIdempotencyRefusals: bad keys and windows, and flags that
// contradict an idempotency key, are usage errors and write nothing.
func TestCLIPublishIdempotencyRefusals(t *testing.T) {
	f := newPublishFixture(t)
	oneLine := f.file("{\"n\":1}\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--idempotency-key", ""}, "--idempotency-key: the idempotency key is empty"},
		{[]string{"--idempotency-key", strings.Repeat("k", 257)}, "--idempotency-key: the idempotency key is 257 bytes, longer than the limit of 256"},
		{[]string{"--idempotency-key", strings.Repeat("k", 255), "--file", oneLine}, "--idempotency-key: the key of event 1 of " + oneLine},
		{[]string{"--idempotency-key", "k", "--idempotency-window", "500ms"}, "--idempotency-window: the idempotency window 500ms is shorter than 1s"},
		{[]string{"--idempotency-key", "k", "--idempotency-window", "721h"}, "--idempotency-window: the idempotency window 721h0m0s is longer than 30 days (720h)"},
		{[]string{"--idempotency-window", "1h"}, "--idempotency-window needs --idempotency-key"},
		{[]string{"--idempotency-key", "k", "--count", "2"}, "--count 2 repeats it on purpose"},
	} {
		args := append([]string{"publish"}, tc.args...)
		if !strings.Contains(strings.Join(tc.args, " "), "--file") {
			args = append(args, `{}`)
		}
		r := relayCLI(t, "", args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || r.stdout != "" {
			t.Errorf("%.80s: exit %d, stdout %q, stderr %q; want exit %d saying %q", strings.Join(args, " "), r.code, r.stdout, r.stderr, exitUsage, tc.want)
		}
	}
	if ids, _, _ := f.entries(); len(ids) != 0 {
		t.Errorf("%d entries written by refused publishes, want none", len(ids))
	}
}

// TestCLIPublishIdempotentResumes: Redis gone midway through a keyed
// --file run, relay publish says where it stopped; run again once Redis is
// back, it publishes the rest only, printing the ids of all.
func TestCLIPublishIdempotentResumes(t *testing.T) {
	isolateEnv(t)
	srv := redistest.Start(t, redistest.Options{AppendOnly: true})
	t.Setenv("REDIS_URI", srv.Addr)
	t.Setenv("REDIS_STREAM", "events")
	f := &publishFixture{t: t, rc: redistest.Connect(t, srv.Addr), stream: "events"}
	var lines strings.Builder
	for i := range 200 {
		fmt.Fprintf(&lines, "{\"n\":%d}\n", i)
	}
	file := f.file(lines.String())
	go func() {
		time.Sleep(500 * time.Millisecond)
		srv.Kill()
	}()
	r := relayCLI(t, "", "publish", "--idempotency-key", "import", "--rate", "40", "--file", file)
	before := strings.Fields(r.stdout)
	want := fmt.Sprintf("%d of 200 done (the ids above), the next is event %d; the same command run again publishes only the rest", len(before), len(before)+1)
	if r.code != exitFailure || len(before) == 0 || len(before) == 200 || !strings.Contains(r.stderr, want) {
		t.Fatalf("exit %d, %d ids, stderr %q; want exit 1 saying %q", r.code, len(before), r.stderr, want)
	}
	srv.Restart(t)
	again := relayCLI(t, "", "publish", "--idempotency-key", "import", "--file", file)
	after := strings.Fields(again.stdout)
	if again.code != exitOK || len(after) != 200 || strings.Join(after[:len(before)], " ") != strings.Join(before, " ") {
		t.Fatalf("rerun: exit %d, %d ids, stderr %q; want 200 ids starting with the %d printed before", again.code, len(after), again.stderr, len(before))
	}
	ids, _, _ := f.entries()
	if strings.Join(ids, " ") != strings.Join(after, " ") {
		t.Errorf("stream holds %d entries, the rerun printed %d ids; want the same 200", len(ids), len(after))
	}
}
