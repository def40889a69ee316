package main

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaydev/relay/internal/testutil"
)

// build compiles relay-exec as the Makefile does, static.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "relay-exec")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// input is the header carrying env, then rest.
func input(t *testing.T, env []string, rest string) []byte {
	t.Helper()
	h, err := json.Marshal(header{Env: env})
	if err != nil {
		t.Fatal(err)
	}
	n := len(h)
	return append(append([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, h...), rest...)
}

// TestRelayExec: the command runs under the header's environment (plus
// relay-exec's own HOME when the header has none, as runc adds it), reads
// what follows the header on stdin, and is found in the header's
// PATH; a command that cannot run exits 127 or 126 naming it, a bad header
// 125; the binary is static.
func TestRelayExec(t *testing.T) {
	bin := build(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("relay-exec is dynamically linked")
		}
	}
	f.Close()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip(err)
	}
	notExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + filepath.Dir(sh) + ":/usr/bin:/bin", "GREETING=hello world"}
	for _, c := range []struct {
		name     string
		args     []string
		stdin    []byte
		code     int
		out, err string
	}{
		{"env and stdin", []string{sh, "-c", `echo "$GREETING|${HOME:-nohome}|$(cat)"`}, input(t, env, `{"id":42}`), 0, "hello world|/root|{\"id\":42}\n", ""},
		{"the header's HOME", []string{sh, "-c", `echo "$HOME"`}, input(t, append(env, "HOME=/app"), ""), 0, "/app\n", ""},
		{"found in PATH", []string{"sh", "-c", "echo $#", "x", "a", "b"}, input(t, env, ""), 0, "2\n", ""},
		{"exit code", []string{sh, "-c", "exit 3"}, input(t, env, ""), 3, "", ""},
		{"missing", []string{"/does/not/exist"}, input(t, env, "x"), 127, "", "relay-exec: exec /does/not/exist: no such file or directory\n"},
		{"not in PATH", []string{"does-not-exist"}, input(t, env, "x"), 127, "", "relay-exec: exec does-not-exist: executable file not found in $PATH\n"},
		{"not executable", []string{notExec}, input(t, env, "x"), 126, "", "relay-exec: exec " + notExec + ": permission denied\n"},
		{"no header", []string{sh, "-c", "true"}, []byte{0, 0}, 125, "", "relay-exec: read the header: unexpected end of stdin\n"},
		{"bad header", []string{sh, "-c", "true"}, append([]byte{0, 0, 0, 2}, "{]"...), 125, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(bin, c.args...)
			cmd.Env = []string{"HOME=/root", "GREETING=from the parent"}
			cmd.Stdin = bytes.NewReader(c.stdin)
			stdout, stderr, code := testutil.RunCommand(t, cmd)
			if code != c.code || stdout != c.out || (c.err != "" && stderr != c.err) {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, %q, %q", code, stdout, stderr, c.code, c.out, c.err)
			}
			if c.code == 125 && !strings.HasPrefix(stderr, "relay-exec: read the header") {
				t.Errorf("stderr %q, want the header's error", stderr)
			}
		})
	}
}
