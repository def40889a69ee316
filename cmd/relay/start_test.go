package main

import (
	"regexp"
	"testing"

	"github.com/alecthomas/kong"
)

// docs/operations.md#configuration: retry backoff, MinPendingIdle and the
// reclaim cadence are fixed in the binary, and so is exhaustion (a rule's
// retries come from its template only). No command reads an environment
// variable, or takes a flag, that sets them.
func TestRetryAndReclaimTimingsAreNotConfigurable(t *testing.T) {
	parser, err := kong.New(&CLI{})
	if err != nil {
		t.Fatal(err)
	}
	internal := regexp.MustCompile(`(?i)retr|backoff|attempt|reclaim|pending.?idle|heartbeat|lease|exhaust`)
	var names []string
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			for _, env := range f.Envs {
				names = append(names, n.Path()+": env "+env)
			}
			names = append(names, n.Path()+": flag --"+f.Name)
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(parser.Model.Node)
	if len(names) < 10 {
		t.Fatalf("found only %v; the walk misses the CLI's flags", names)
	}
	for _, name := range names {
		if internal.MatchString(name) {
			t.Errorf("%s sets what docs/operations.md#configuration fixes", name)
		}
	}
}
