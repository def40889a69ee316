package relay

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the Engine's Prometheus collectors (docs/observability.md#metrics).
// Labels are bounded: app, handler and outcome only.
type metrics struct {
	received, matched, unmatched, malformed prometheus.Counter
	missingPayload, concurrencyWaits        prometheus.Counter
	oversized, claimsVoided                 prometheus.Counter
	invocations                             *prometheus.CounterVec
	duration                                *prometheus.HistogramVec
	retries, dlqEntries                     *prometheus.CounterVec
	deferrals, superseded                   *prometheus.CounterVec
	inFlight, pending, pendingAge           prometheus.Gauge
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Name: name, Help: help})
	}
	m := &metrics{
		received:         counter("events_received_total", "Stream entries delivered to this worker (each delivery counts)."),
		matched:          counter("events_matched_total", "External events that matched at least one rule."),
		unmatched:        counter("events_unmatched_total", "External events that matched no rule and were acknowledged."),
		malformed:        counter("events_malformed_total", "Entries whose event field is missing or not a JSON object."),
		missingPayload:   counter("missing_payload_total", "Reclaimed PEL entries whose stream body no longer exists (data loss)."),
		concurrencyWaits: counter("concurrency_waits_total", "Invocations that had to wait for a concurrency slot."),
		oversized:        counter("events_oversized_total", "Events larger than MAX_EVENT_BYTES, dead-lettered without decoding."),
		claimsVoided:     counter("claims_given_back_total", "Claims whose reply was lost, or whose release failed, given back uncharged once Redis answered."),
		invocations: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Name: "invocations_total",
			Help: "Handler attempts by outcome (success, failure, timeout, oom, unavailable, error, lost)."}, []string{"app", "handler", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "relay", Name: "invocation_duration_seconds",
			Help: "Duration of handler attempts that ran.", Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 12)}, []string{"app", "handler"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Name: "retries_total",
			Help: "Failed attempts scheduled for a retry."}, []string{"app", "handler"}),
		dlqEntries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Name: "dlq_entries_total",
			Help: "Dead-letter entries written."}, []string{"app", "handler"}),
		deferrals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Name: "flow_deferrals_total",
			Help: "Claims a rule's flow control deferred, by limit (concurrency, rate, debounce); an invocation counts once per try."}, []string{"app", "handler", "limit"}),
		superseded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Name: "superseded_total",
			Help: "Invocations not run because a newer event with their debounce key was recorded."}, []string{"app", "handler"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Name: "in_flight_invocations",
			Help: "Invocations running now."}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Name: "pending_entries",
			Help: "Entries in the consumer group's PEL (delivered, not acknowledged), cluster-wide."}),
		pendingAge: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Name: "pending_oldest_age_seconds",
			Help: "Age of the oldest pending entry, from its stream id, cluster-wide."}),
	}
	if r == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.received, m.matched, m.unmatched, m.malformed, m.missingPayload,
		m.concurrencyWaits, m.oversized, m.claimsVoided, m.invocations, m.duration, m.retries, m.dlqEntries, m.deferrals, m.superseded, m.inFlight, m.pending, m.pendingAge} {
		errs = append(errs, r.Register(c))
	}
	return m, errors.Join(errs...)
}
