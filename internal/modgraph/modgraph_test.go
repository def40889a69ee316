// Package modgraph checks what a module that requires Relay gets in its
// module graph (docs/embedding.md#what-your-module-graph-gets): Go puts
// there every requirement of the library's go.mod, whichever packages the
// module imports, so the modules only the repository's own tools and tests
// use (Kubernetes, kustomize, BuildKit, chromedp) must be required by the
// tools module (tools/go.mod) instead.
package modgraph

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/relaydev/relay"

// forbidden are the modules a consumer's graph must not hold, each with
// the modules under its path; one ending in / is a prefix. Every module
// tools/go.mod requires directly and the library does not is forbidden
// too.
var forbidden = []string{
	"k8s.io/",
	"sigs.k8s.io/",
	"github.com/moby/buildkit",
	"github.com/chromedp/",
}

// goMod is the part of `go mod edit -json` read here.
type goMod struct {
	Go      string
	Require []struct{ Path string }
}

func goTool(t *testing.T) string {
	t.Helper()
	g, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	return g
}

// run runs the go command in dir and returns its standard output.
func run(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(goTool(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, msg)
	}
	return string(out)
}

func readGoMod(t *testing.T, path string) goMod {
	t.Helper()
	var m goMod
	if err := json.Unmarshal([]byte(run(t, filepath.Dir(path), nil, "mod", "edit", "-json", path)), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestConsumerGraph makes a throwaway module that requires the library of
// this checkout (a replace) at the library's go version, and lists its
// module graph: none of the tools' modules is in it, and the module stays
// at that go version. The consumer gets the library's go.sum, so Go needs
// nothing beyond the module cache and the module proxy.
func TestConsumerGraph(t *testing.T) {
	root := filepath.Dir(strings.TrimSpace(run(t, ".", []string{"GOWORK=off"}, "env", "GOMOD")))
	lib := readGoMod(t, filepath.Join(root, "go.mod"))
	tools := readGoMod(t, filepath.Join(root, "tools", "go.mod"))
	bad := slices.Clone(forbidden)
	for _, r := range tools.Require {
		if r.Path != module && !slices.ContainsFunc(lib.Require, func(l struct{ Path string }) bool { return l.Path == r.Path }) {
			bad = append(bad, r.Path)
		}
	}

	dir := t.TempDir()
	mod := "module example.com/embedder\n\ngo " + lib.Go + "\n\nrequire " + module + " v0.0.0-00010101000000-000000000000\n\nreplace " + module + " => " + root + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"GOFLAGS=-mod=mod", "GOWORK=off"}
	graph := strings.Fields(run(t, dir, env, "list", "-m", "-f", "{{.Path}}", "all"))
	if !slices.Contains(graph, module) {
		t.Fatalf("the consumer's module graph lacks %s:\n%s", module, strings.Join(graph, "\n"))
	}
	for _, m := range graph {
		for _, b := range bad {
			if m == b || strings.HasPrefix(m, strings.TrimSuffix(b, "/")+"/") {
				t.Errorf("a module requiring %s gets %s in its module graph: only the repository's tools and tests use it (require it in tools/go.mod)", module, m)
			}
		}
	}
	if got := readGoMod(t, filepath.Join(dir, "go.mod")).Go; got != lib.Go {
		t.Errorf("the consumer's go directive became %s; the library asks for %s", got, lib.Go)
	}
	t.Logf("go %s; %d modules in the graph", lib.Go, len(graph))
}
