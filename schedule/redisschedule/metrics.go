package redisschedule

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay/schedule"
)

// Metrics counts what a worker's Schedulers did with occurrences
// (docs/observability.md#metrics): relay_schedule_occurrences_published_total
// and relay_schedule_occurrences_duplicate_total. Every worker publishes
// every occurrence, so the sum of published over workers is the number of
// occurrences. Create one per registry and pass Observe to WithObserver of
// every Scheduler the worker runs, including those it rebuilds when its
// schedules change. Safe for concurrent use.
type Metrics struct {
	published, duplicate prometheus.Counter
}

// NewMetrics registers the counters on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Name: "schedule_occurrences_published_total",
			Help: "Schedule occurrences this worker wrote to the stream."}),
		duplicate: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Name: "schedule_occurrences_duplicate_total",
			Help: "Schedule occurrences this worker found already published (by another worker or an earlier run)."}),
	}
	for _, c := range []prometheus.Collector{m.published, m.duplicate} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Observe counts one occurrence's result; it has the signature WithObserver
// takes.
func (m *Metrics) Observe(_ schedule.Spec, _ time.Time, r Result) {
	switch r {
	case Published:
		m.published.Inc()
	case Duplicate:
		m.duplicate.Inc()
	}
}
