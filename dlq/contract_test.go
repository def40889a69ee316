package dlq_test

import (
	"testing"
	"time"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/relaytest"
)

// TestWriterContract runs the shared relay.DLQWriter suite against Writer on
// the shared redis-server, reading entries back through Store.
func TestWriterContract(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t)
	relaytest.TestDLQWriter(t, func(t *testing.T) relaytest.DLQWriterHarness {
		name := relaytest.UniqueName(t)
		store := dlq.NewStore(c, name)
		return relaytest.DLQWriterHarness{
			Writer: dlq.NewWriter(c, name),
			Stream: name,
			List: func(t *testing.T) []dlq.Entry {
				t.Helper()
				entries, err := store.List(t.Context(), dlq.Filter{})
				if err != nil {
					t.Fatalf("List: %v", err)
				}
				return entries
			},
			// Write fills a zero Timestamp from the host's clock.
			Now: func(*testing.T) time.Time { return time.Now() },
		}
	})
}
