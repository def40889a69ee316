// Package cluster_test runs Relay on the distributed Redis topologies that
// operators run it on (docs/deployment.md), started by the project's own
// scripts through internal/topology:
//
//   - a 3-master Redis Cluster (scripts/cluster.sh) consumed by two relay
//     start processes over four hash-tagged streams, checking every
//     message's outcome and that each stream's state and DLQ stay in the
//     stream's own hash slot;
//   - a master + replica + 3 sentinels (scripts/sentinel.sh) whose master
//     is killed while two workers consume, checking with a ledger that no
//     message is lost across the failover.
//
// The suites skip without redis-server or with -short, unless
// RELAY_TEST_REQUIRE=1 (make test, make test-cluster) makes them fail.
package cluster_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/relaydev/relay/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// buildRelay compiles the relay binary under test.
func buildRelay(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "relay")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/relay").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// writeApp writes one app named name with template src into a new apps
// root and returns the root.
func writeApp(t *testing.T, name, src string, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files["template.yaml"] = src
	for f, body := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}
