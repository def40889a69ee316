package apptest

import (
	"sync"
	"time"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule"
	"github.com/relaydev/relay/schedule/cron"
)

// Calls records handler runs, per "app/handler". Safe for concurrent use;
// the zero value is ready.
type Calls struct {
	mu   sync.Mutex
	runs map[string][]runtime.Request
}

// Add records req.
func (c *Calls) Add(req runtime.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[string][]runtime.Request{}
	}
	k := req.App + "/" + req.Handler
	c.runs[k] = append(c.runs[k], req)
}

// Count is how many runs of k ("app/handler") were recorded.
func (c *Calls) Count(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.runs[k])
}

// Get returns the requests of k's runs, in order.
func (c *Calls) Get(k string) []runtime.Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]runtime.Request(nil), c.runs[k]...)
}

// NightlyApp is app billing's template with one schedule, nightly,
// firing jobs.nightly at 03:00 in Berlin.
const NightlyApp = `
image: relay.local/busybox:latest
schedules:
  - name: nightly
    handler: jobs.nightly
    cron: "0 3 * * *"
    timezone: Europe/Berlin
    timeout: 5s
    retries: 1
`

// NightlyAt is a real firing of NightlyApp's schedule (03:00 CET).
var NightlyAt = time.Date(2026, 1, 15, 2, 0, 0, 0, time.UTC)

// NightlySpec is the schedule.Spec of NightlyApp's schedule.
func NightlySpec() schedule.Spec {
	berlin, _ := time.LoadLocation("Europe/Berlin")
	return schedule.Spec{App: "billing", Name: "nightly", Handler: "jobs.nightly", Cron: cron.MustParse("0 3 * * *", berlin)}
}
