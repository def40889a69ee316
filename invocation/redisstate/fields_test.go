package redisstate

import (
	"testing"

	"github.com/relaydev/relay/invocation"
)

// TestReservedFieldsMatchInvocation: the reserved fields the Store and its
// scripts write are the ones package invocation reads.
func TestReservedFieldsMatchInvocation(t *testing.T) {
	if got := invocation.TraceField("a/h"); got != tracePrefix+"a/h" {
		t.Errorf("invocation.TraceField = %q, want prefix %q", got, tracePrefix)
	}
	if got := invocation.DLQField("a/h"); got != dlqPrefix+"a/h" {
		t.Errorf("invocation.DLQField = %q, want prefix %q", got, dlqPrefix)
	}
	if u := invocation.UnfinishedOf(map[string]string{terminalField: "1", "a/h": "running:1:1:t"}); len(u.Fields) != 0 {
		t.Errorf("UnfinishedOf a hash with %s = %+v, want nothing unfinished", terminalField, u)
	}
	if u := invocation.UnfinishedOf(map[string]string{matchedField: "1"}); !u.Complete {
		t.Errorf("UnfinishedOf a hash with %s = %+v, want Complete", matchedField, u)
	}
}
