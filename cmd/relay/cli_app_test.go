package main

import (
	"strings"
	"testing"
)

// TestCLIApp covers relay app ls and inspect against testdata/cli_apps.
func TestCLIApp(t *testing.T) {
	isolateEnv(t)
	apps := cliApps(t)
	empty := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"app_ls", []string{"app", "ls"}, exitOK},
		{"app_ls_json", []string{"app", "ls", "--json"}, exitOK},
		{"app_ls_empty", []string{"app", "ls", "--apps", empty}, exitOK},
		{"app_ls_missing_root", []string{"app", "ls", "--apps", "testdata/no-such-dir"}, exitFailure},
		{"app_inspect", []string{"app", "inspect", "shop", "--now", "2026-03-28T12:00:00Z"}, exitOK},
		{"app_inspect_json", []string{"app", "inspect", "shop", "--json", "--now", "2026-03-28T12:00:00Z"}, exitOK},
		{"app_inspect_bad_now", []string{"app", "inspect", "shop", "--now", "tomorrow"}, exitUsage},
		{"app_inspect_broken", []string{"app", "inspect", "broken"}, exitOK},
		{"app_inspect_runtime", []string{"app", "inspect", "py"}, exitOK},
		{"app_inspect_unknown", []string{"app", "inspect", "nope"}, exitFailure},
		{"app_inspect_no_name", []string{"app", "inspect"}, exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--apps", apps}, tc.args...)
			r := relayCLI(t, "", args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d", r.code, tc.code)
			}
			if strings.Contains(r.stdout+r.stderr, "s3cret") {
				t.Errorf("an env value is shown:\n%s", r.stdout)
			}
			checkCLIGolden(t, tc.name, r.transcript(apps, "<apps>", empty, "<empty>"))
		})
	}
}

// TestCLIAppInvoke runs handlers with the process runner: no Redis and no
// containerd are configured, so nothing can be recorded anywhere.
func TestCLIAppInvoke(t *testing.T) {
	isolateEnv(t)
	apps := cliApps(t)
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
		code  int
	}{
		// orders.audit succeeds, orders.charge fails: both run, exit 1.
		{name: "invoke_order", args: []string{"--event", `{"kind":"order","amount":250}`}, code: exitFailure},
		{name: "invoke_order_json", args: []string{"--event", `{"kind":"order","amount":250}`, "--json"}, code: exitFailure},
		{name: "invoke_small_order", args: []string{"--event", `{"kind":"order","amount":5}`}, code: exitOK},
		{name: "invoke_file", args: []string{"--file", "testdata/cli_events/refund.json"}, code: exitOK},
		{name: "invoke_stdin", stdin: `{"kind":"refund","id":13}`, code: exitOK},
		{name: "invoke_message_id", args: []string{"--event", `{"kind":"order","amount":250}`, "--message-id", "1700000000000-5", "--json"}, code: exitFailure},
		{name: "invoke_bad_message_id", args: []string{"--event", `{"kind":"refund"}`, "--message-id", "a\nb"}, code: exitUsage},
		{name: "invoke_no_match", args: []string{"--event", `{"kind":"nothing"}`}, code: exitOK},
		{name: "invoke_no_match_json", args: []string{"--event", `{"kind":"nothing"}`, "--json"}, code: exitOK},
		{name: "invoke_array", args: []string{"--event", `[{"kind":"order"}]`}, code: exitUsage},
		{name: "invoke_string_stdin", stdin: `"order"`, code: exitUsage},
		{name: "invoke_not_json", args: []string{"--event", `{kind: order}`}, code: exitUsage},
		{name: "invoke_both_inputs", args: []string{"--event", `{}`, "--file", "testdata/cli_events/refund.json"}, code: exitUsage},
		{name: "invoke_missing_file", args: []string{"--file", "testdata/cli_events/nope.json"}, code: exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--apps", apps, "app", "invoke", "shop", "--runner", "process"}, tc.args...)
			r := relayCLI(t, tc.stdin, args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d", r.code, tc.code)
			}
			checkCLIGolden(t, tc.name, r.transcript(apps, "<apps>"))
		})
	}
	for _, tc := range []struct {
		name string
		app  string
	}{{"invoke_unavailable", "broken"}, {"invoke_unknown_app", "nope"}} {
		t.Run(tc.name, func(t *testing.T) {
			r := relayCLI(t, "", "--apps", apps, "app", "invoke", tc.app, "--runner", "process", "--event", `{"kind":"order"}`)
			if r.code != exitFailure {
				t.Errorf("exit %d, want 1", r.code)
			}
			checkCLIGolden(t, tc.name, r.transcript(apps, "<apps>"))
		})
	}
}
