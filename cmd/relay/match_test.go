package main

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	gocmp "github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestMatch runs `relay match` against the apps in testdata/apps and
// compares exit code, stdout and stderr with testdata/match_<name>.golden.
// Rewrite the golden files with go test ./cmd/relay -run TestMatch -update.
func TestMatch(t *testing.T) {
	// Unless a case says otherwise, the apps are testdata/apps and now()
	// cutoffs are evaluated at a fixed time, so output is stable.
	defaults := []string{"--apps", "testdata/apps", "--now", "2026-09-12T10:00:00Z"}
	tests := []struct {
		name  string
		args  []string
		stdin string // when set, the event is piped on stdin
	}{
		{name: "order", args: []string{"--file", "testdata/events/order_insert.json"}},
		{name: "order_explain", args: []string{"--file", "testdata/events/order_insert.json", "--explain"}},
		{name: "order_json", args: []string{"--file", "testdata/events/order_insert.json", "--json"}},
		{name: "user_explain", args: []string{"--event", `{"event_name":"MODIFY","table_name":"users","new_image":{"id":"123","score":42}}`, "--explain"}},
		{name: "user_explain_json", args: []string{"--file", "testdata/events/user_update.json", "--explain", "--json"}},
		{name: "stdin", stdin: `{"event_name":"INSERT","table_name":"users","new_image":{"id":"user_7","score":99}}`},
		{name: "stdin_dash", args: []string{"--file", "-"}, stdin: `{"event_name":"DELETE"}`},
		{name: "no_match", args: []string{"--event", `{"table_name":"users"}`}},
		{name: "no_match_json", args: []string{"--event", `{"table_name":"users"}`, "--json"}},
		{name: "later_cutoff", args: []string{"--file", "testdata/events/order_insert.json", "--now", "2026-09-12T10:30:00Z"}},
		{name: "malformed_array", args: []string{"--event", `[{"event_name":"INSERT"}]`}},
		{name: "malformed_json", args: []string{"--event", `{"event_name":`}},
		{name: "malformed_stdin", stdin: `"INSERT"`},
		{name: "empty_stdin", stdin: "\n"},
		{name: "trailing_data", args: []string{"--event", `{"a":1} {"b":2}`}},
		{name: "both_inputs", args: []string{"--event", `{}`, "--file", "testdata/events/user_update.json"}},
		{name: "missing_file", args: []string{"--file", "testdata/events/nope.json"}},
		{name: "bad_now", args: []string{"--event", `{}`, "--now", "yesterday"}},
		{name: "missing_root", args: []string{"--event", `{}`, "--apps", "testdata/no-such-dir"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.stdin != "" {
				setStdin(t, tt.stdin)
			}
			args := []string{"match"}
			for i := 0; i < len(defaults); i += 2 {
				if !slices.Contains(tt.args, defaults[i]) {
					args = append(args, defaults[i], defaults[i+1])
				}
			}
			args = append(args, tt.args...)
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), args, &stdout, &stderr)
			var got strings.Builder
			fmt.Fprintf(&got, "$ relay %s\n", strings.Join(quoteArgs(args), " "))
			if tt.stdin != "" {
				fmt.Fprintf(&got, "stdin: %s\n", cmp.Or(strings.TrimSpace(tt.stdin), "(blank)"))
			}
			fmt.Fprintf(&got, "exit: %d\n-- stdout --\n%s-- stderr --\n%s", code, &stdout, &stderr)
			checkGolden(t, filepath.Join("testdata", "match_"+tt.name+".golden"), got.String())
		})
	}
}

// setStdin points os.Stdin at a file holding s for the rest of the test.
func setStdin(t *testing.T, s string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stdin")
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdin
	os.Stdin = f
	t.Cleanup(func() {
		os.Stdin = old
		f.Close()
	})
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.IndexFunc(a, unicode.IsControl) >= 0 {
			// Bash's $'...', whose escapes are Go's.
			q := strconv.Quote(a)
			a = "$'" + strings.ReplaceAll(q[1:len(q)-1], "'", `\'`) + "'"
		} else if a == "" || strings.ContainsAny(a, " \"'{}[]*?$\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return out
}

// checkGolden compares got with the golden file, or rewrites it under -update.
func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/relay -run TestMatch -update to create it)", err)
	}
	if diff := gocmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

// TestMatchEscapesTemplateText: handler names and pattern paths come from
// templates, valid or not, and reach the terminal escaped: an escape
// sequence or a newline in them can neither recolour the screen nor forge
// a line of output.
func TestMatchEscapesTemplateText(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "a")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tpl := "image: x\nevents:\n" +
		"  - handler: \"h.b\\e[31mRED\\nbilling/fake.run\"\n    pattern: {\"k\\e[2J\": [v]}\n" +
		"  - handler: ok.run\n    pattern: {\"k\\e[2J\": [v]}\n"
	if err := os.WriteFile(filepath.Join(dir, "template.yaml"), []byte(tpl), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	run(context.Background(), []string{"match", "--apps", root, "--explain", "--event", `{"k":"v"}`}, &out, &errb)
	if strings.ContainsAny(out.String(), "\x1b") || strings.Contains(out.String(), "\nbilling/fake.run") {
		t.Errorf("template text reached the output unescaped:\n%q", out.String())
	}
	if !strings.Contains(out.String(), `a/h.b\x1b[31mRED\x0abilling/fake.run`) || !strings.Contains(out.String(), `"k\x1b[2J": missing`) {
		t.Errorf("escaped names and paths missing from the output:\n%s", out.String())
	}
}

// TestMatchEventKeepsItsBytes: --event reaches the matcher byte for byte,
// so an event that is not UTF-8 is malformed here as it is for a worker,
// not turned into U+FFFD on the way.
func TestMatchEventKeepsItsBytes(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"match", "--apps", "testdata/apps", "--event", "{\"table_name\":\"users\xff\"}"}, &stdout, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "malformed event from --event: not valid UTF-8") {
		t.Errorf("exit %d, stdout %q, stderr %q; want the event refused as not UTF-8", code, stdout.String(), stderr.String())
	}
}

// TestTemplateErrorsAreEscaped: relay validate and relay app inspect print
// template errors, which hold the app's directory name and text of the
// template, escaped as relay match does: a directory named with an escape
// sequence and a newline can neither recolour the terminal nor forge a
// line of output.
func TestTemplateErrorsAreEscaped(t *testing.T) {
	root := t.TempDir()
	name := "bad\x1b[31mred\nforged: ok"
	if err := os.MkdirAll(filepath.Join(root, name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, name, "template.yaml"), []byte("runtime: go\nevents: [{handler: a.b, pattern: {k: [v]}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"validate", "--apps", root}, {"app", "inspect", "--apps", root, name}} {
		var out, errb bytes.Buffer
		run(context.Background(), args, &out, &errb)
		if strings.ContainsAny(out.String(), "\x1b") || strings.Contains(out.String(), "\nforged: ok") {
			t.Errorf("relay %s: template error reached the output unescaped:\n%q", args[0], out.String())
		}
		if !strings.Contains(out.String(), `bad\x1b[31mred\x0aforged: ok/template.yaml:1:1: app name`) {
			t.Errorf("relay %s: escaped error missing from the output:\n%s", args[0], out.String())
		}
	}
}
