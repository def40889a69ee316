package apps_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDemoTracesEachEventOnce runs the block of scripts/demo.sh that
// publishes the sample events under set -x, with a redis-cli that only
// records its calls: make demo's output must show each XADD once.
func TestDemoTracesEachEventOnce(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash is not installed")
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "scripts", "demo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	const on, off = "\nset -x\n", "\n{ set +x; } 2>/dev/null\n"
	start, end := strings.Index(script, on), strings.Index(script, off)
	if start < 0 || end < start {
		t.Fatalf("scripts/demo.sh has no block from %q to %q", on, off)
	}
	// The block may call the script's one-line helpers, such as rcli.
	helpers := regexp.MustCompile(`(?m)^[a-z_]+\(\) \{.*\}$`).FindAllString(script, -1)
	bin := t.TempDir()
	calls := filepath.Join(bin, "calls")
	stub := "#!/bin/sh\necho \"$*\" >>\"$CALLS\"\necho 1-0\n"
	if err := os.WriteFile(filepath.Join(bin, "redis-cli"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bash, "-euo", "pipefail", "-c", strings.Join(helpers, "\n")+script[start:end+len(off)])
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"CALLS="+calls, "RELAY_REDIS_PORT=6379", "REDIS_STREAM=relay-demo-1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the publishing block of scripts/demo.sh: %v\n%s", err, stderr.String())
	}
	out, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	published := strings.Count(string(out), " XADD ")
	var traced []string
	for _, l := range strings.Split(stderr.String(), "\n") {
		if strings.HasPrefix(l, "+") && strings.Contains(l, " XADD ") {
			traced = append(traced, l)
		}
	}
	if published == 0 || len(traced) != published {
		t.Errorf("%d events published, %d XADD lines traced, want one each:\n%s", published, len(traced), strings.Join(traced, "\n"))
	}
}
