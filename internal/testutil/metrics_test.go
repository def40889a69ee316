package testutil

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jobs_total"}, []string{"app", "outcome"})
	reg.MustRegister(c)
	c.WithLabelValues("shop", "success").Add(2)
	c.WithLabelValues("shop", "failure").Add(3)
	c.WithLabelValues("billing", "success").Add(5)

	if ms := Metrics(t, reg, "jobs_total"); len(ms) != 3 {
		t.Errorf("all of the family: %d metrics, want 3", len(ms))
	}
	ms := Metrics(t, reg, "jobs_total", "app", "shop", "outcome", "failure")
	if len(ms) != 1 || ms[0].GetCounter().GetValue() != 3 {
		t.Errorf("shop failures: %v, want the one counter of 3", ms)
	}
	if ms := Metrics(t, reg, "jobs_total", "app", "none"); len(ms) != 0 {
		t.Errorf("no such label value: %v, want none", ms)
	}
	if ms := Metrics(t, reg, "absent_total"); ms != nil {
		t.Errorf("an absent family: %v, want none", ms)
	}
}
