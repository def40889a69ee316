package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// TestCLIDLQReplay replays the fixture entries with the process runner:
// success deletes, failure keeps and says why, malformed entries and
// handlers that are gone are refused.
func TestCLIDLQReplay(t *testing.T) {
	isolateEnv(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		left []string // entries left afterwards; nil means all
	}{
		{name: "replay_success", args: []string{idRefund}, left: without(idRefund)},
		{name: "replay_failure", args: []string{idCharge}, code: exitFailure},
		{name: "replay_malformed", args: []string{idMalformed}, code: exitFailure},
		{name: "replay_handler_gone", args: []string{idGone}, code: exitFailure},
		{name: "replay_app_unavailable", args: []string{idBroken}, code: exitFailure},
		{name: "replay_unknown_id", args: []string{"1-1"}, code: exitFailure},
		{name: "replay_bad_id", args: []string{"bogus"}, code: exitUsage},
		{name: "replay_all", args: []string{"--all"}, code: exitFailure, left: without(idRefund)},
		{name: "replay_all_json", args: []string{"--all", "--json"}, code: exitFailure, left: without(idRefund)},
		{name: "replay_all_filtered", args: []string{"--all", "--app", "shop", "--handler", "refunds.run"}, left: without(idRefund)},
		{name: "replay_all_limit", args: []string{"--all", "--app", "shop", "--limit", "1"}, left: without(idRefund)},
		{name: "replay_all_none", args: []string{"--all", "--app", "none"}},
		{name: "replay_nothing", code: exitUsage},
		{name: "replay_id_and_all", args: []string{idRefund, "--all"}, code: exitUsage},
		{name: "replay_id_and_filter", args: []string{idRefund, "--app", "shop"}, code: exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newDLQFixture(t)
			r := f.relay("", append([]string{"dlq", "replay", "--runner", "process"}, tc.args...)...)
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
			// A kept entry's replay history says what the replay met,
			// as the console shows it.
			if tc.name == "replay_failure" {
				h, err := f.store.Replays(t.Context(), idCharge)
				if err != nil || h.Count != 1 || h.LastResult != dlq.ReplayFailed || !strings.Contains(h.LastError, "handler exited with code 3") {
					t.Errorf("replay history of %s: %+v, %v; want one failed replay with its error", idCharge, h, err)
				}
				if r := f.relay("", "dlq", "inspect", idCharge); !strings.Contains(r.stdout, "Replays:           1 without success; the last") ||
					!strings.Contains(r.stdout, ": failed: replay of "+idCharge) {
					t.Errorf("relay dlq inspect after a failed replay:\n%s", r.stdout)
				}
				if r := f.relay("", "dlq", "inspect", "--json", idCharge); !strings.Contains(r.stdout, `"replays": {`) ||
					!strings.Contains(r.stdout, `"count": 1`) || !strings.Contains(r.stdout, `"last_result": "failed"`) {
					t.Errorf("relay dlq inspect --json after a failed replay:\n%s", r.stdout)
				}
			}
		})
	}
}

// TestCLIDLQReplayContainerd is the operator's walk-through on real Redis
// and containerd with the example apps: an entry whose handler still
// fails is kept, with the reason; after the app is fixed, replaying it
// deletes it and the DLQ is empty.
func TestCLIDLQReplayContainerd(t *testing.T) {
	isolateEnv(t)
	cc := containerdtest.Client(t)
	t.Setenv("CONTAINERD_NAMESPACE", cc.DefaultNamespace())
	// A copy of the example apps, so the test can fix billing; the handler
	// user reads it through the "other" permission bits.
	apps := t.TempDir()
	if err := os.Chmod(apps, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(apps, os.DirFS("../../examples/apps")); err != nil {
		t.Fatal(err)
	}
	if err := filepath.WalkDir(apps, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if d.IsDir() {
			mode = 0o755
		}
		return os.Chmod(p, mode)
	}); err != nil {
		t.Fatal(err)
	}

	f := &dlqFixture{t: t, rc: redistest.Client(t), stream: redistest.Name(t, "events")}
	f.store = redisdlq.NewStore(f.rc, f.stream)
	// A DLQ exists because its source stream does; relay refuses a stream
	// that is not there (a mistyped REDIS_STREAM).
	if err := redisstream.New(f.rc, f.stream, "relay", "fixture").EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	const usersID, billingID = "1700000000000-0", "1700000000000-1"
	f.seed(usersID, dlq.Entry{OriginalID: "1699999990000-1", App: "users", Handler: "events.created",
		Event:  `{"event_name":"INSERT","table_name":"users","new_image":{"id":42,"email":"ada@example.com"}}`,
		Reason: "handler timed out", HandlerAttempts: 3})
	f.seed(billingID, dlq.Entry{OriginalID: "1699999990000-2", App: "billing", Handler: "invoices.charge",
		Event:  `{"event_name":"INSERT","table_name":"invoices","new_image":{"id":7}}`,
		Reason: "handler exited with code 3", HandlerAttempts: 1})
	replay := func(id string) cliRun {
		t.Helper()
		return relayCLI(t, "", "--redis-uri", redistest.Addr(t), "--stream", f.stream, "--apps", apps, "dlq", "replay", id)
	}

	r := replay(usersID)
	if r.code != exitOK || !strings.Contains(r.stdout, "[users/events.created] welcome user ada@example.com (message 1699999990000-1, attempt 4)") ||
		!strings.Contains(r.stdout, "Replayed "+usersID+" (users/events.created) in ") {
		t.Errorf("replay of a handler that now succeeds: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if got := f.ids(); !slices.Equal(got, []string{billingID}) {
		t.Errorf("after a successful replay the DLQ holds %v, want only %s", got, billingID)
	}

	r = replay(billingID)
	want := "relay: replay of " + billingID + " (billing/invoices.charge) failed: handler exited with code 3: billing: payment provider unreachable (demo failure), giving up; the entry is kept\n"
	if r.code != exitFailure || !strings.HasSuffix(r.stderr, want) || strings.Count(r.stderr, "relay: ") != 1 {
		t.Errorf("replay of a failing handler: exit %d\nstdout:\n%s\nstderr:\n%s\nwant the stderr to end with:\n%s", r.code, r.stdout, r.stderr, want)
	}
	if got := f.ids(); !slices.Equal(got, []string{billingID}) {
		t.Errorf("after a failed replay the DLQ holds %v, want %s kept", got, billingID)
	}

	// Fix the app, replay, and the DLQ is empty.
	script := filepath.Join(apps, "billing", "handler.sh")
	src, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	fixed := strings.Replace(string(src), "giving up\" >&2\n\texit 3", "giving up\" >&2\n\texit 0", 1)
	if fixed == string(src) {
		t.Fatal("could not fix billing/handler.sh; has the example changed?")
	}
	if err := os.WriteFile(script, []byte(fixed), 0o644); err != nil {
		t.Fatal(err)
	}
	r = relayCLI(t, "", "--redis-uri", redistest.Addr(t), "--stream", f.stream, "--apps", apps, "dlq", "replay", "--all")
	if r.code != exitOK || !strings.Contains(r.stdout, "Replayed "+billingID) {
		t.Errorf("replay --all after the fix: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = relayCLI(t, "", "--redis-uri", redistest.Addr(t), "--stream", f.stream, "dlq", "ls")
	if r.code != exitOK || r.stdout != "No dead-letter entries\n" {
		t.Errorf("dlq ls after the fix: exit %d, stdout %q", r.code, r.stdout)
	}
	containerdtest.AssertClean(t, cc)
}

// TestCLIAppInvokeContainerd invokes the example apps in containerd.
func TestCLIAppInvokeContainerd(t *testing.T) {
	isolateEnv(t)
	cc := containerdtest.Client(t)
	t.Setenv("CONTAINERD_NAMESPACE", cc.DefaultNamespace())
	r := relayCLI(t, "", "--apps", "../../examples/apps", "app", "invoke", "users",
		"--event", `{"event_name":"INSERT","table_name":"users","new_image":{"email":"ada@example.com"}}`)
	if r.code != exitOK || !invokeIDRE.MatchString(r.stdout) ||
		!strings.Contains(r.stdout, "[users/events.created] welcome user ada@example.com (message invoke-") ||
		!strings.Contains(r.stdout, "users/events.created: ok in ") {
		t.Errorf("invoke users: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = relayCLI(t, "", "--apps", "../../examples/apps", "app", "invoke", "billing",
		"--event", `{"event_name":"INSERT","table_name":"invoices"}`)
	if r.code != exitFailure || !strings.Contains(r.stdout, "billing/invoices.charge: failed after ") ||
		!strings.HasSuffix(r.stderr, "relay: 1 of 1 handler failed\n") {
		t.Errorf("invoke billing: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	containerdtest.AssertClean(t, cc)
}

// envApp has two rules that match every event, whose handler prints the
// RELAY_* variables it was given, sorted.
const envApp = `image: ` + containerdtest.Image + `
command: [/bin/sh, -c, "env | grep ^RELAY_ | sort"]
events:
  - {handler: env.first, pattern: {kind: [{exists: true}]}}
  - {handler: env.second, pattern: {kind: [{exists: true}]}}
`

// TestCLIAppInvokeMessageID: relay app invoke gives the handlers, in
// containerd, a RELAY_MESSAGE_ID that no stream entry id can be, one per
// command and shared by its handlers, and shown before they run;
// --message-id sets it (docs/apps.md#the-handler-contract).
func TestCLIAppInvokeMessageID(t *testing.T) {
	isolateEnv(t)
	cc := containerdtest.Client(t)
	t.Setenv("CONTAINERD_NAMESPACE", cc.DefaultNamespace())
	apps := testutil.AppsRoot(t, map[string]string{"envapp": envApp})
	invoke := func(args ...string) map[string]string {
		t.Helper()
		r := relayCLI(t, "", append([]string{"--apps", apps, "app", "invoke", "envapp", "--event", `{"kind":"x"}`}, args...)...)
		if r.code != exitOK {
			t.Fatalf("invoke envapp %q: exit %d\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
		}
		// The id each handler printed, and the one shown before it ran.
		ids := map[string]string{}
		for line := range strings.Lines(r.stdout) {
			line = strings.TrimSuffix(line, "\n")
			if rest, ok := strings.CutPrefix(line, "Running envapp/"); ok {
				h, shown, _ := strings.Cut(rest, " (message ")
				ids["shown "+h] = strings.TrimSuffix(shown, ")")
			}
			if rest, ok := strings.CutPrefix(line, "[envapp/"); ok {
				h, v, _ := strings.Cut(rest, "] ")
				if id, ok := strings.CutPrefix(v, "RELAY_MESSAGE_ID="); ok {
					ids[h] = id
				}
			}
		}
		for _, h := range []string{"env.first", "env.second"} {
			if !strings.Contains(r.stdout, "[envapp/"+h+"] RELAY_ATTEMPT=1\n") || !strings.Contains(r.stdout, "[envapp/"+h+"] RELAY_HANDLER="+h+"\n") {
				t.Errorf("%s's environment lacks RELAY_ATTEMPT=1 or its RELAY_HANDLER:\n%s", h, r.stdout)
			}
		}
		return ids
	}

	ids := invoke()
	id := ids["env.first"]
	if !invokeIDRE.MatchString(id) || len(id) != len("invoke-")+16 || stream.IsID(id) {
		t.Errorf("RELAY_MESSAGE_ID %q, want invoke- and 16 hex digits", id)
	}
	for _, k := range []string{"env.second", "shown env.first", "shown env.second"} {
		if ids[k] != id {
			t.Errorf("%s: message id %q, want the one env.first got, %q (all: %v)", k, ids[k], id, ids)
		}
	}
	if again := invoke()["env.first"]; again == id || !invokeIDRE.MatchString(again) {
		t.Errorf("a second invoke's message id %q, want another generated one than %q", again, id)
	}
	set := invoke("--message-id", "1718000000000-7")
	if set["env.first"] != "1718000000000-7" || set["env.second"] != "1718000000000-7" {
		t.Errorf("with --message-id 1718000000000-7 the handlers got %v", set)
	}
	containerdtest.AssertClean(t, cc)
}
