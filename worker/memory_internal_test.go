package worker

import (
	"testing"

	"github.com/relaydev/relay/stats"
)

// TestOverBudgetPart: the warning blames the part that grows without
// bound, else the largest projected part, else the memory that is not
// Relay's.
func TestOverBudgetPart(t *testing.T) {
	for _, c := range []struct {
		name string
		m    stats.Memory
		want string
	}{
		{"unbounded stream", stats.Memory{Projected: -1, Stream: stats.Part{Projected: -1}}, partStream},
		{"unbounded dead letters", stats.Memory{Projected: -1, DLQ: stats.Part{Projected: -1}}, partDLQ},
		{"retained state largest", stats.Memory{Used: 100, Projected: 900,
			Stream: stats.Part{Projected: 300}, Invocations: stats.Part{Projected: 500}}, partInvocations},
		{"stream largest", stats.Memory{Used: 100, Projected: 900,
			Stream: stats.Part{Projected: 600}, Invocations: stats.Part{Projected: 200}}, partStream},
		{"other keys largest", stats.Memory{Used: 100, Projected: 900,
			Other: stats.Part{Bytes: 50, Projected: 700}}, partOther},
		{"not Relay's", stats.Memory{Used: 1000, Projected: 1100,
			Stream: stats.Part{Bytes: 10, Projected: 50}}, partNotRelay},
		// Redis full, producers refused, so the rate and the stream's
		// projection fell to 0: the stream takes the most now.
		{"over budget now only", stats.Memory{Used: 3000, Max: 3000, Projected: 1500,
			Stream: stats.Part{Bytes: 2000, Projected: 0}, Invocations: stats.Part{Bytes: 100, Projected: 200}}, partStream},
	} {
		if got := overBudgetPart(c.m); got != c.want {
			t.Errorf("%s: blamed %q, want %q", c.name, got, c.want)
		}
	}
}
