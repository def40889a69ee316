// Package flow_test checks flow control (docs/flow-control.md) end to end:
// three worker processes (this test binary run again, see
// TestWorkerProcess) of one consumer group consume one stream of a real
// redis-server, and the limits that hold across workers are enforced by
// the state store's scripts, as in production. Each worker is a
// worker.Worker, what relay start runs, over an apps root of templates,
// with in-process Go handlers (runtime.Func) that record every run in
// Redis (probe.go): its start and end on the Redis clock, its worker's
// pid, the lease its claim took, and how many runs of its limit key and
// of its app overlap. The tests read those records across processes, kill
// workers with SIGKILL where a crash is the point, and check the outcome
// in Redis: invocation state, the consumer group's PEL, the dead-letter
// stream and the slots of the rule.
//
//   - TestConcurrencyPerKey: concurrency: 2 per customer across the cluster.
//   - TestRateBesideUnlimitedApp: rate: 20/s measured over a minute
//     (RELAY_FLOW_RATE_DURATION), while an app without limits on the same
//     stream runs at full speed.
//   - TestClusterSlotAfterSIGKILL: the slot of a worker killed mid-run comes
//     back when its lease ends, and the killed invocation is retried.
//   - TestDebounceUnderKills: only the last event of a burst runs, and none
//     is lost while workers are killed.
//   - TestMaxAge: events older than max_age are dead-lettered unrun, also
//     those that grew too old waiting for their rate.
//
// FLOW_LOG_DIR keeps the workers' logs (one directory per test).
package flow_test

import (
	"testing"

	"github.com/relaydev/relay/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }
