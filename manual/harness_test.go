package manual_test

import (
	"context"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule"
	"github.com/relaydev/relay/schedule/cron"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// nightlyApp has one schedule firing at 03:00 in Berlin.
const nightlyApp = `
image: relay.local/busybox:latest
schedules:
  - name: nightly
    handler: jobs.nightly
    cron: "0 3 * * *"
    timezone: Europe/Berlin
    timeout: 5s
    retries: 1
`

// nightlyAt is a real firing of nightlyApp's schedule (03:00 CET).
var nightlyAt = time.Date(2026, 1, 15, 2, 0, 0, 0, time.UTC)

func nightlySpec() schedule.Spec {
	berlin, _ := time.LoadLocation("Europe/Berlin")
	return schedule.Spec{App: "billing", Name: "nightly", Handler: "jobs.nightly", Cron: cron.MustParse("0 3 * * *", berlin)}
}

type runnerFunc func(context.Context, runtime.Request) (runtime.Result, error)

func (f runnerFunc) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	return f(ctx, req)
}
