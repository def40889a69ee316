package worker

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// streamMetrics are the counters of one stream's retainer and janitor
// (docs/observability.md#metrics).
type streamMetrics struct {
	streamTrimmed, dlqTrimmed, leaksRetained prometheus.Counter
}

func newStreamMetrics(r prometheus.Registerer) (*streamMetrics, error) {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Name: name, Help: help})
	}
	m := &streamMetrics{
		streamTrimmed: counter("stream_trimmed_total", "Entries this worker removed from the source stream by retention."),
		dlqTrimmed:    counter("dlq_trimmed_total", "Entries this worker removed from the dead-letter stream by retention."),
		leaksRetained: counter("invocation_state_repaired_total", "Invocation hashes left without a TTL after their message was acknowledged, switched to retention by the janitor."),
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.streamTrimmed, m.dlqTrimmed, m.leaksRetained} {
		errs = append(errs, r.Register(c))
	}
	return m, errors.Join(errs...)
}
