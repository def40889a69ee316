package main

import (
	"regexp"
	"strings"
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

// TestStartRefusesSubMillisecondInvocationRetention: invocation state's
// TTL is set in milliseconds, so a REDIS_INVOCATION_RETENTION above 0 and
// under 1ms is a usage error at start, before Redis is dialled, rather than
// a worker whose every acknowledgement and dead-letter write fails after
// its handler ran (the messages then stay pending and run again).
func TestStartRefusesSubMillisecondInvocationRetention(t *testing.T) {
	isolateRedisEnv(t)
	t.Setenv("REDIS_URI", "127.0.0.1:1") // never dialled
	t.Setenv("REDIS_STREAM", "events")
	t.Setenv("REDIS_GROUP", "relay")
	for _, v := range []string{"1ns", "500us", "-1s"} {
		r := relayCLI(t, "", "start", "--runner", "process", "--state-dir", t.TempDir(), "--invocation-retention="+v)
		if r.code != exitUsage || !strings.Contains(r.stderr, "REDIS_INVOCATION_RETENTION must be 0 (delete with the ack) or at least 1ms") {
			t.Errorf("relay start --invocation-retention=%s: exit %d, want %d naming the setting:\n%s", v, r.code, exitUsage, r.stderr)
		}
	}
}
