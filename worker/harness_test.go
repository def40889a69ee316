package worker_test

import (
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// fastConfig shrinks the Engine timings docs/delivery.md fixes so tests
// take seconds.
func fastConfig() relay.Config {
	return relay.Config{
		MinPendingIdle:    300 * time.Millisecond,
		ReclaimInterval:   50 * time.Millisecond,
		HeartbeatInterval: 50 * time.Millisecond,
		Backoff:           []time.Duration{200 * time.Millisecond, 400 * time.Millisecond},
		LeaseGrace:        500 * time.Millisecond,
		ConcurrencyWait:   200 * time.Millisecond,
		ShutdownTimeout:   2 * time.Second,
	}
}
