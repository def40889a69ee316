package faults_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/relaydev/relay/app"
	ctrd "github.com/relaydev/relay/runtime/containerd"
)

// writeSoakApp writes the app soakAppName, its template and handler.sh,
// into a new apps root and returns the root.
func writeSoakApp(t *testing.T, template, handler string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, soakAppName)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{app.TemplateFile: template, "handler.sh": handler} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The handler user (65534) reads /app through the "other" bits.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// buildExecHelper builds relay-exec for the containerd workers, which then
// prepare containers with their tasks, as relay start does.
func buildExecHelper(t *testing.T) string {
	t.Helper()
	helper := filepath.Join(t.TempDir(), ctrd.ExecHelperName)
	if out, err := exec.Command("env", "CGO_ENABLED=0", "go", "build", "-o", helper, "../../cmd/relay-exec").CombinedOutput(); err != nil {
		t.Fatalf("build relay-exec: %v\n%s", err, out)
	}
	return helper
}
