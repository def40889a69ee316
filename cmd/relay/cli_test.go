package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"
)

// Helpers of the operator CLI tests (app, dlq, health, stats). The golden
// files are testdata/cli_*.golden; rewrite them with
// go test ./cmd/relay -run 'TestCLI' -update and review the diff.

// cliApps is the apps root of the CLI tests, as an absolute path.
func cliApps(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("testdata/cli_apps")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// validApps is an apps root whose every template is valid, for the apps
// check of relay health in tests about something else.
const validApps = "../../examples/embed/apps"

// isolateEnv unsets every environment variable the CLI reads, so that the
// developer's settings do not leak into a test; set what a test needs after.
func isolateEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{"REDIS_URI", "REDIS_STREAM", "REDIS_GROUP", "RELAY_APPS", "RELAY_RUNNER", "RELAY_CONSUMER",
		"CONTAINERD_NAMESPACE", "LOG_LEVEL", "LOG_FORMAT", "COLUMNS",
		"REDIS_CLUSTER", "REDIS_SENTINEL_MASTER", "REDIS_USERNAME", "REDIS_PASSWORD", "REDIS_SENTINEL_USERNAME",
		"REDIS_SENTINEL_PASSWORD", "REDIS_TLS_CA_FILE", "REDIS_TLS_CERT_FILE", "REDIS_TLS_KEY_FILE", "RELAY_STATE_DIR",
		"RELAY_SHUTDOWN_TIMEOUT", "RELAY_STARTUP_WAIT", "MAX_CONCURRENCY", "METRICS_ADDR", "REDIS_DLQ_RETENTION", "RELAY_CONSOLE_TOKEN", "TRACEPARENT"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
}

// cliRun is one CLI run's outcome.
type cliRun struct {
	args           []string
	stdin          string
	code           int
	stdout, stderr string
}

// relayCLI runs relay with args (and stdin when not empty).
func relayCLI(t *testing.T, stdin string, args ...string) cliRun {
	t.Helper()
	if stdin != "" {
		setStdin(t, stdin)
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return cliRun{args: args, stdin: stdin, code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// transcript renders r as the golden files show it, after replacing every
// old string of repl by its new one and normalising what changes between
// runs: times, durations, stream ids written by Redis, the message ids
// relay app invoke generates.
func (r cliRun) transcript(repl ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "$ relay %s\n", strings.Join(quoteArgs(r.args), " "))
	if r.stdin != "" {
		fmt.Fprintf(&b, "stdin: %s\n", cmp.Or(strings.TrimSpace(r.stdin), "(blank)"))
	}
	fmt.Fprintf(&b, "exit: %d\n-- stdout --\n%s-- stderr --\n%s", r.code, r.stdout, r.stderr)
	return normalize(b.String(), repl...)
}

var (
	rfc3339RE  = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
	durationRE = regexp.MustCompile(`(ok in|failed after|\) in) [0-9.]+(ns|µs|ms|s|m)`)
	durJSONRE  = regexp.MustCompile(`"duration_seconds": [0-9.e-]+`)
	invokeIDRE = regexp.MustCompile(`invoke-[0-9a-f]{16}`)
)

func normalize(s string, repl ...string) string {
	s = strings.NewReplacer(repl...).Replace(s)
	s = rfc3339RE.ReplaceAllString(s, "<time>")
	s = durationRE.ReplaceAllString(s, "$1 <duration>")
	s = invokeIDRE.ReplaceAllString(s, "invoke-<id>")
	return durJSONRE.ReplaceAllString(s, `"duration_seconds": <duration>`)
}

// checkCLIGolden compares got with testdata/cli_<name>.golden, or rewrites
// the file under -update.
func checkCLIGolden(t *testing.T, name, got string) {
	t.Helper()
	checkGolden(t, filepath.Join("testdata", "cli_"+name+".golden"), got)
}

// TestCLIHelp checks that every new command's --help has examples and
// exits 0 without touching Redis or containerd.
func TestCLIHelp(t *testing.T) {
	isolateEnv(t)
	for _, cmd := range [][]string{
		{"app", "ls"}, {"app", "inspect"}, {"app", "invoke"},
		{"dlq", "ls"}, {"dlq", "inspect"}, {"dlq", "replay"}, {"dlq", "rm"},
		{"health"}, {"stats"}, {"start"}, {"validate"}, {"match"}, {"console"},
	} {
		r := relayCLI(t, "", append(cmd, "--help")...)
		if r.code != exitOK || !strings.Contains(r.stdout, "Examples:") || !strings.Contains(r.stdout, "relay "+strings.Join(cmd, " ")) || r.stderr != "" {
			t.Errorf("relay %s --help: exit %d, stderr %q, stdout:\n%s", strings.Join(cmd, " "), r.code, r.stderr, r.stdout)
		}
	}
	// The memory budget (docs/operations.md#memory-budget) is part of
	// what stats shows and health checks: their help says so, and why
	// they take the retention flags.
	for _, cmd := range []string{"stats", "health"} {
		if r := relayCLI(t, "", cmd, "--help"); !strings.Contains(r.stdout, "memory budget") || !strings.Contains(r.stdout, "maxmemory") {
			t.Errorf("relay %s --help does not mention the memory budget:\n%s", cmd, r.stdout)
		}
	}
}

// writeTemplates writes one template.yaml per app into a temporary apps
// root and loads it.
func writeTemplates(t *testing.T, templates map[string]string) *app.Set {
	t.Helper()
	root := t.TempDir()
	for name, src := range templates {
		if err := os.MkdirAll(filepath.Join(root, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name, app.TemplateFile), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	apps, err := template.LoadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	return apps
}

// TestCLIHelpShowsDefaults: every flag with a default names it in its
// command's --help. kong shows a default in place of the placeholder, so
// a flag with both (--listen=HOST:PORT) must say it in its help text.
func TestCLIHelpShowsDefaults(t *testing.T) {
	isolateEnv(t)
	parser, err := kong.New(&CLI{})
	if err != nil {
		t.Fatal(err)
	}
	space := regexp.MustCompile(`\s+`)
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, c := range n.Children {
			walk(c)
		}
		if n.Type != kong.CommandNode {
			return
		}
		for _, f := range n.Flags {
			for _, e := range f.Envs {
				t.Setenv(e, "")
				os.Unsetenv(e)
			}
		}
		path := strings.Fields(n.Path())
		r := relayCLI(t, "", append(path, "--help")...)
		help := space.ReplaceAllString(r.stdout, " ")
		for _, f := range n.Flags {
			if f.Default == "" || f.IsBool() {
				continue
			}
			shown := false
			for _, s := range []string{"--" + f.Name + "=" + f.Default, "--" + f.Name + `="` + f.Default + `"`, "default " + f.Default} {
				shown = shown || strings.Contains(help, s)
			}
			if !shown {
				t.Errorf("relay %s --help does not show the default %q of --%s", n.Path(), f.Default, f.Name)
			}
		}
	}
	walk(parser.Model.Node)
}
