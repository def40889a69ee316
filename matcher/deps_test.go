package matcher_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoYAMLDependency keeps the YAML reader out of matcher and so out of
// the root package, which imports matcher: reading YAML is the job of
// matcher/yamlpattern (docs/embedding.md#worker).
func TestNoYAMLDependency(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list dependencies: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/relaydev/relay", "github.com/relaydev/relay/matcher").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		if strings.HasPrefix(dep, "github.com/goccy/go-yaml") {
			t.Errorf("the root package or matcher depends on %s", dep)
		}
	}
}
