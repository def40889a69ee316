package redisdlq_test

import (
	"testing"
	"time"

	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/relaytest"
)

var (
	_ relaytest.DLQWriter = (*redisdlq.Writer)(nil)
	_ relaytest.DLQReader = (*redisdlq.Store)(nil)
)

// TestWriterContract runs the shared dead-letter queue suite against
// Writer on the shared redis-server, reading entries back through Store.
func TestWriterContract(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t)
	relaytest.TestDLQWriter(t, func(t *testing.T) relaytest.DLQWriterHarness {
		name := relaytest.UniqueName(t)
		return relaytest.DLQWriterHarness{
			Writer: redisdlq.NewWriter(c, name),
			Reader: redisdlq.NewStore(c, name),
			Stream: name,
			// Write fills a zero Timestamp from the host's clock.
			Now: func(*testing.T) time.Time { return time.Now() },
		}
	})
}
