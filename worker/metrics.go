package worker

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// streamMetrics are the counters of one stream's retainer and janitor
// (docs/observability.md#metrics).
type streamMetrics struct {
	streamTrimmed, dlqTrimmed, leaksRetained prometheus.Counter
	memoryProjected, maxmemory, usedMemory   prometheus.Gauge
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
	m.memoryProjected = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Name: "redis_memory_projected_bytes",
		Help: "Redis used_memory the stream's parts level off at when the current event rate goes on with this worker's retentions; +Inf when a part grows without bound."})
	m.maxmemory = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Name: "redis_maxmemory_bytes",
		Help: "maxmemory of the Redis node that holds the stream; 0 when none is set."})
	m.usedMemory = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Name: "redis_used_memory_bytes",
		Help: "used_memory of the Redis node that holds the stream, when the projection was measured."})
	var errs []error
	for _, c := range []prometheus.Collector{m.streamTrimmed, m.dlqTrimmed, m.leaksRetained, m.memoryProjected, m.maxmemory, m.usedMemory} {
		errs = append(errs, r.Register(c))
	}
	return m, errors.Join(errs...)
}
