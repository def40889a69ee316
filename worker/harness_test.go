package worker_test

import (
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/runtime"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// calls records handler runs, per "app/handler".
type calls struct {
	mu   sync.Mutex
	runs map[string][]runtime.Request
}

func (c *calls) add(req runtime.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[string][]runtime.Request{}
	}
	k := req.App + "/" + req.Handler
	c.runs[k] = append(c.runs[k], req)
}

func (c *calls) count(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.runs[k])
}

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

func (c *calls) get(k string) []runtime.Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]runtime.Request(nil), c.runs[k]...)
}
