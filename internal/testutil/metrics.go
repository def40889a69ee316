package testutil

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// GatherMetrics returns the metrics of the family name that g gathers,
// in g's order, keeping those whose labels include every pair of labels
// (name, value, name, value, ...); none when the family is absent. Its
// error is Gather's, for callers outside a test's goroutine (a worker
// process a test runs).
func GatherMetrics(g prometheus.Gatherer, name string, labels ...string) ([]*dto.Metric, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, err
	}
	var out []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, labels) {
				out = append(out, m)
			}
		}
	}
	return out, nil
}

// Metrics is GatherMetrics that fails t when g cannot gather.
func Metrics(t testing.TB, g prometheus.Gatherer, name string, labels ...string) []*dto.Metric {
	t.Helper()
	ms, err := GatherMetrics(g, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// hasLabels reports whether m has every label of pairs (name, value, ...).
func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			found = found || (l.GetName() == pairs[i] && l.GetValue() == pairs[i+1])
		}
		if !found {
			return false
		}
	}
	return true
}
