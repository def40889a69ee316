package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/stream/redisstream"
)

// dlqFixture is a dead-letter queue on the shared redis-server, seeded
// with entries whose ids are fixed, so the golden files can show them.
type dlqFixture struct {
	t      *testing.T
	rc     rueidis.Client
	stream string
	store  *redisdlq.Store
}

// Ids of the fixture entries, oldest first.
const (
	idRefund    = "1700000000000-0" // shop/refunds.run: its handler succeeds
	idCharge    = "1700000000000-1" // shop/orders.charge: its handler fails
	idMalformed = "1700000060000-0" // a malformed message
	idGone      = "1700000120000-0" // an app that no longer exists
	idBroken    = "1700000180000-0" // an app with template errors
)

func newDLQFixture(t *testing.T) *dlqFixture {
	t.Helper()
	rc := redistest.Client(t)
	f := &dlqFixture{t: t, rc: rc, stream: redistest.Name(t, "events")}
	f.store = redisdlq.NewStore(rc, f.stream)
	// A DLQ exists because its source stream does; relay refuses a stream
	// that is not there (a mistyped REDIS_STREAM).
	if err := redisstream.New(f.rc, f.stream, "relay", "fixture").EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	f.seed(idRefund, dlq.Entry{OriginalID: "1699999990000-7", App: "shop", Handler: "refunds.run",
		Event: `{"kind":"refund","id":12}`, Reason: "handler timed out", Deliveries: 5, HandlerAttempts: 5,
		Timestamp: now.Add(-50 * time.Hour)})
	f.seed(idCharge, dlq.Entry{OriginalID: "1699999990000-8", App: "shop", Handler: "orders.charge",
		Event:      `{"kind":"order","amount":250,"customer":{"id":"c_42","tier":"gold"}}`,
		Reason:     "handler exited with code 3: card declined (message 1699999990000-8, attempt 3); the payment provider said no again",
		Deliveries: 3, HandlerAttempts: 3, Timestamp: now.Add(-3*time.Hour - time.Minute),
		Trace: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
	f.seed(idMalformed, dlq.Entry{OriginalID: "1699999990000-9", App: dlq.MalformedName, Handler: dlq.MalformedName,
		Event: `{"kind": "order",`, Reason: "malformed event: not valid JSON: unexpected EOF", Deliveries: 1,
		Timestamp: now.Add(-5*time.Minute - 10*time.Second)})
	f.seed(idGone, dlq.Entry{OriginalID: "1699999990001-0", App: "gone", Handler: "old.handler",
		Event: `{"kind":"order"}`, Reason: "handler exited with code 1", Deliveries: 1, HandlerAttempts: 1,
		Timestamp: now.Add(-90 * time.Second)})
	f.seed(idBroken, dlq.Entry{OriginalID: "1699999990001-1", App: "broken", Handler: "audit.all",
		Event: `{"kind":"order"}`, Reason: "handler exited with code 1", Deliveries: 1, HandlerAttempts: 1,
		Timestamp: now.Add(-20 * time.Second)})
	return f
}

// seed adds e with id to the DLQ stream (XADD with an explicit id).
func (f *dlqFixture) seed(id string, e dlq.Entry) {
	f.t.Helper()
	e.OriginalStream, e.Group, e.Consumer = f.stream, "workers", "worker-1"
	fields := dlq.Encode(e)
	cmd := f.rc.B().Xadd().Key(f.store.Key()).Id(id).FieldValue()
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		cmd = cmd.FieldValue(k, fields[k])
	}
	if err := f.rc.Do(context.Background(), cmd.Build()).Error(); err != nil {
		f.t.Fatal(err)
	}
}

// ids lists the entries left, oldest first.
func (f *dlqFixture) ids() []string {
	f.t.Helper()
	es, err := f.store.List(context.Background(), dlq.Filter{})
	if err != nil {
		f.t.Fatal(err)
	}
	var ids []string
	for _, e := range es {
		ids = append(ids, e.ID)
	}
	return ids
}

// relay runs the CLI against this fixture's stream and the CLI test apps.
func (f *dlqFixture) relay(stdin string, args ...string) cliRun {
	f.t.Helper()
	base := []string{"--redis-uri", redistest.Addr(f.t), "--stream", f.stream, "--apps", cliApps(f.t)}
	return relayCLI(f.t, stdin, append(base, args...)...)
}

func (f *dlqFixture) transcript(r cliRun) string {
	return r.transcript(redistest.Addr(f.t), "<redis>", f.stream, "events", cliApps(f.t), "<apps>")
}

var allIDs = []string{idRefund, idCharge, idMalformed, idGone, idBroken}

func without(ids ...string) []string {
	return slices.DeleteFunc(slices.Clone(allIDs), func(id string) bool { return slices.Contains(ids, id) })
}

// TestCLIDLQ covers relay dlq ls, inspect and rm. Each case gets a freshly
// seeded queue and checks which entries are left.
func TestCLIDLQ(t *testing.T) {
	isolateEnv(t)
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
		code  int
		left  []string // entries left afterwards; nil means all
	}{
		{name: "dlq_ls", args: []string{"dlq", "ls"}},
		{name: "dlq_ls_json", args: []string{"dlq", "ls", "--json", "--app", "shop"}},
		{name: "dlq_ls_handler", args: []string{"dlq", "ls", "--handler", "orders.charge"}},
		{name: "dlq_ls_malformed", args: []string{"dlq", "ls", "--app=-"}},
		{name: "dlq_ls_limit", args: []string{"dlq", "ls", "--limit", "2"}},
		{name: "dlq_ls_limit_one", args: []string{"dlq", "ls", "--limit", "1"}},
		{name: "dlq_ls_keep_forever", args: []string{"dlq", "ls", "--dlq-retention", "0"}},
		{name: "dlq_ls_bad_retention", args: []string{"dlq", "ls", "--dlq-retention=-1h"}, code: exitUsage},
		{name: "dlq_ls_none", args: []string{"dlq", "ls", "--app", "none", "--since", "2h"}},
		{name: "dlq_ls_bad_since", args: []string{"dlq", "ls", "--since", "yesterday"}, code: exitUsage},
		{name: "dlq_ls_bad_limit", args: []string{"dlq", "ls", "--limit", "-1"}, code: exitUsage},
		{name: "dlq_inspect", args: []string{"dlq", "inspect", idCharge}},
		{name: "dlq_inspect_json", args: []string{"dlq", "inspect", idCharge, "--json"}},
		{name: "dlq_inspect_malformed", args: []string{"dlq", "inspect", idMalformed}},
		{name: "dlq_inspect_unknown", args: []string{"dlq", "inspect", "1-1"}, code: exitFailure},
		{name: "dlq_inspect_bad_id", args: []string{"dlq", "inspect", "bogus"}, code: exitUsage},
		{name: "dlq_rm", args: []string{"dlq", "rm", idCharge, idCharge}, left: without(idCharge)}, // one line for an ID given twice
		{name: "dlq_rm_unknown", args: []string{"dlq", "rm", "1-1"}, code: exitFailure},
		{name: "dlq_rm_bad_id", args: []string{"dlq", "rm", idGone, "bogus"}, code: exitUsage},                 // nothing deleted
		{name: "dlq_rm_some_unknown", args: []string{"dlq", "rm", idGone, "1-1", idBroken}, code: exitFailure}, // all or nothing
		{name: "dlq_rm_all_declined", args: []string{"dlq", "rm", "--all", "--app", "shop"}, stdin: "n\n", code: exitFailure},
		{name: "dlq_rm_all_no_answer", args: []string{"dlq", "rm", "--all"}, stdin: " ", code: exitFailure},
		{name: "dlq_rm_all_confirmed", args: []string{"dlq", "rm", "--all", "--app", "shop"}, stdin: "y\n", left: without(idRefund, idCharge)},
		{name: "dlq_rm_all_yes", args: []string{"dlq", "rm", "--all", "--app=-", "--yes"}, left: without(idMalformed)},
		{name: "dlq_rm_all_none", args: []string{"dlq", "rm", "--all", "--handler", "none", "--yes"}},
		{name: "dlq_rm_nothing", args: []string{"dlq", "rm"}, code: exitUsage},
		{name: "dlq_rm_id_and_all", args: []string{"dlq", "rm", idCharge, "--all"}, code: exitUsage},
		{name: "dlq_rm_id_and_yes", args: []string{"dlq", "rm", idCharge, "--yes"}, code: exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newDLQFixture(t)
			r := f.relay(tc.stdin, tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d", r.code, tc.code)
			}
			checkCLIGolden(t, tc.name, f.transcript(r))
			want := tc.left
			if want == nil {
				want = allIDs
			}
			if got := f.ids(); !slices.Equal(got, want) {
				t.Errorf("entries left %v, want %v", got, want)
			}
		})
	}
}

func TestCLIDLQNeedsRedisSettings(t *testing.T) {
	isolateEnv(t)
	r := relayCLI(t, "", "dlq", "ls")
	if r.code != exitUsage || r.stderr != "relay: missing required configuration: REDIS_URI (--redis-uri), REDIS_STREAM (--stream)\n" {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestCLIDLQSince filters by the time in the entry ids, which Redis
// assigns; these entries are written relative to now.
func TestCLIDLQSince(t *testing.T) {
	isolateEnv(t)
	f := newDLQFixture(t)
	nowMS := time.Now().UnixMilli()
	oldID := strconv.FormatInt(nowMS-2*time.Hour.Milliseconds(), 10) + "-0"
	newID := strconv.FormatInt(nowMS-time.Minute.Milliseconds(), 10) + "-0"
	for _, id := range []string{oldID, newID} {
		f.seed(id, dlq.Entry{OriginalID: "1-1", App: "shop", Handler: "refunds.run", Event: `{}`, Reason: "r", HandlerAttempts: 1})
	}
	for _, tc := range []struct {
		since string
		want  []string
	}{
		{"30m", []string{newID}},
		{"3h", []string{oldID, newID}},
		{"0.5d", []string{oldID, newID}},
		{time.UnixMilli(nowMS - 90*time.Minute.Milliseconds()).UTC().Format(time.RFC3339), []string{newID}},
	} {
		r := f.relay("", "dlq", "ls", "--json", "--since", tc.since)
		var got []dlqJSON
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != exitOK {
			t.Fatalf("--since %s: exit %d, %v, stderr %s", tc.since, r.code, err, r.stderr)
		}
		var ids []string
		for _, e := range got {
			ids = append(ids, e.ID)
		}
		if !slices.Equal(ids, tc.want) {
			t.Errorf("--since %s listed %v, want %v", tc.since, ids, tc.want)
		}
	}
	// rm --all takes the same filter.
	r := f.relay("", "dlq", "rm", "--all", "--since", "30m", "--yes")
	if r.code != exitOK || !strings.Contains(r.stdout, "Deleted 1 entry (since 30m)") || slices.Contains(f.ids(), newID) || !slices.Contains(f.ids(), oldID) {
		t.Errorf("rm --all --since 30m: exit %d, stdout %q, left %v", r.code, r.stdout, f.ids())
	}
}

// TestCLIDLQExpires: ls and inspect show when the retention removes each
// entry, from the time in its id; REDIS_DLQ_RETENTION sets the retention
// like --dlq-retention, and 0 keeps entries forever.
func TestCLIDLQExpires(t *testing.T) {
	isolateEnv(t)
	f := newDLQFixture(t)
	nowMS := time.Now().UnixMilli()
	day := 24 * time.Hour.Milliseconds()
	half := 30 * time.Minute.Milliseconds()                         // a margin for the test's own run time
	soonID := strconv.FormatInt(nowMS-13*day-day/2+half, 10) + "-0" // expires in 12h30m
	laterID := strconv.FormatInt(nowMS-day+half, 10) + "-0"         // expires in 13d and 30m
	for _, id := range []string{soonID, laterID} {
		f.seed(id, dlq.Entry{OriginalID: "1-1", App: "shop", Handler: "refunds.run", Event: `{}`, Reason: "r", HandlerAttempts: 1, Timestamp: time.Now()})
	}
	expiresOf := func(t *testing.T, args ...string) map[string]string {
		t.Helper()
		r := f.relay("", append([]string{"dlq", "ls"}, args...)...)
		if r.code != exitOK {
			t.Fatalf("%v: exit %d, stderr %s", args, r.code, r.stderr)
		}
		out := map[string]string{}
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		col := strings.Index(lines[0], "EXPIRES")
		for _, l := range lines[1:] {
			v := strings.Fields(l[col:])
			if v[0] == "in" {
				v[0] += " " + v[1]
			}
			out[strings.Fields(l)[0]] = v[0]
		}
		return out
	}
	got := expiresOf(t)
	if got[soonID] != "in 12h" || got[laterID] != "in 13d" || got[idRefund] != "due" {
		t.Errorf("EXPIRES with the default retention: %v", got)
	}
	// The default is the workers' default.
	r := f.relay("", "dlq", "ls", "--json")
	var es []dlqJSON
	if err := json.Unmarshal([]byte(r.stdout), &es); err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		ms, _, _ := strings.Cut(e.ID, "-")
		n, _ := strconv.ParseInt(ms, 10, 64)
		if want := time.UnixMilli(n).Add(dlq.DefaultRetention).UTC().Format(time.RFC3339Nano); e.Expires != want {
			t.Errorf("%s: expires %q, want %q", e.ID, e.Expires, want)
		}
	}
	t.Setenv("REDIS_DLQ_RETENTION", "48h")
	if got := expiresOf(t); got[laterID] != "in 24h" || got[soonID] != "due" {
		t.Errorf("EXPIRES with REDIS_DLQ_RETENTION=48h: %v", got)
	}

	r = f.relay("", "dlq", "inspect", laterID, "--json", "--dlq-retention", "0")
	var e dlqJSON
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil || e.Expires != "" || strings.Contains(r.stdout, "expires") {
		t.Errorf("inspect --json with retention 0: %v, %s", err, r.stdout)
	}
	r = f.relay("", "dlq", "inspect", laterID, "--dlq-retention", "24h")
	if !regexp.MustCompile(`\nExpires: +in 2[89]m \(`).MatchString(r.stdout) {
		t.Errorf("inspect with 24h:\n%s", r.stdout)
	}
}

// TestCLIDLQJSONTimes checks that --json gives RFC 3339 times, which the
// golden files show normalised.
func TestCLIDLQJSONTimes(t *testing.T) {
	isolateEnv(t)
	f := newDLQFixture(t)
	r := f.relay("", "dlq", "inspect", idCharge, "--json")
	var e dlqJSON
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil {
		t.Fatal(err)
	}
	ts, err := time.Parse(time.RFC3339, e.Timestamp)
	if err != nil || time.Since(ts) < 3*time.Hour || time.Since(ts) > 4*time.Hour {
		t.Errorf("timestamp %q: %v", e.Timestamp, err)
	}
}

// A mistyped REDIS_STREAM must not read as an empty DLQ ("all clear").
func TestDLQMissingStream(t *testing.T) {
	t.Setenv("REDIS_URI", redistest.Addr(t))
	t.Setenv("REDIS_STREAM", redistest.Name(t, "evnets"))
	for _, args := range [][]string{{"dlq", "ls"}, {"dlq", "inspect", "1-0"}, {"dlq", "rm", "1-0"}} {
		var out, errb bytes.Buffer
		code := run(t.Context(), args, &out, &errb)
		if code != exitFailure || !strings.Contains(errb.String(), "does not exist") || !strings.Contains(errb.String(), "check REDIS_STREAM") {
			t.Errorf("%v: code %d, stderr %q, stdout %q", args, code, errb.String(), out.String())
		}
	}
}

// An entry relay cannot decode (written by hand, or by another program)
// must not lock the operator out: every command that meets it says how to
// delete it, and relay dlq rm by id does.
func TestCLIDLQUnreadableEntry(t *testing.T) {
	isolateEnv(t)
	f := newDLQFixture(t)
	const idBad = "1700000240000-0"
	add := f.rc.B().Xadd().Key(f.store.Key()).Id(idBad).FieldValue().
		FieldValue("original_stream", f.stream).FieldValue("original_id", "1-0").
		FieldValue("app", "shop").FieldValue("handler", "orders.charge").
		FieldValue("event", "{}").FieldValue("reason", "x").
		FieldValue("deliveries", "NaN").FieldValue("handler_attempts", "1").Build()
	if err := f.rc.Do(t.Context(), add).Error(); err != nil {
		t.Fatal(err)
	}
	hint := "relay dlq rm " + idBad + " deletes it"
	for _, args := range [][]string{
		{"dlq", "ls"},
		{"dlq", "ls", "--app", "shop"},
		{"dlq", "inspect", idBad},
		{"dlq", "replay", idBad},
		{"dlq", "replay", "--all", "--app", "gone"},
		{"dlq", "rm", "--all", "--yes"},
	} {
		r := f.relay("", args...)
		if r.code != exitFailure || !strings.Contains(r.stderr, hint) {
			t.Errorf("relay %v: exit %d, stderr %q; want exit %d and %q", args, r.code, r.stderr, exitFailure, hint)
		}
	}
	if n, err := f.store.Len(t.Context()); err != nil || n != int64(len(allIDs)+1) {
		t.Fatalf("after the refused commands the DLQ holds %d entries (%v), want %d", n, err, len(allIDs)+1)
	}
	r := f.relay("", "dlq", "rm", idBad)
	if r.code != 0 || r.stdout != "Deleted "+idBad+"\n" {
		t.Fatalf("relay dlq rm %s: exit %d, stdout %q, stderr %q", idBad, r.code, r.stdout, r.stderr)
	}
	if got := f.ids(); !slices.Equal(got, allIDs) {
		t.Errorf("entries left %v, want %v", got, allIDs)
	}
	if r := f.relay("", "dlq", "ls"); r.code != 0 {
		t.Errorf("relay dlq ls after the removal: exit %d, stderr %q", r.code, r.stderr)
	}
}

// relay dlq ls | head: the reader closes the pipe early. There is nothing
// to report ("relay: write /dev/stdout: broken pipe"); the exit status
// stays non-zero, as a shell's SIGPIPE status, since a command cut short
// (a replay --all --json) may not have done everything.
func TestCLIDLQClosedOutput(t *testing.T) {
	isolateEnv(t)
	f := newDLQFixture(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	defer w.Close()
	var stderr bytes.Buffer
	args := []string{"--redis-uri", redistest.Addr(t), "--stream", f.stream, "--apps", cliApps(t), "dlq", "ls"}
	if code := run(t.Context(), args, w, &stderr); code != exitFailure || stderr.Len() != 0 {
		t.Errorf("relay dlq ls into a closed pipe: exit %d, stderr %q; want exit %d and nothing", code, stderr.String(), exitFailure)
	}
}
