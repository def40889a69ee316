package main

// Checks of the deployment files in deploy/observability against the
// metrics this binary registers and docs/observability.md#metrics.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/redistest"

	"github.com/goccy/go-yaml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/worker"
)

// documentedMetricNames are the Prometheus names
// docs/observability.md#metrics lists, without the relay_ prefix.
var documentedMetricNames = []string{
	"events_received_total", "events_matched_total", "events_unmatched_total", "events_malformed_total",
	"invocations_total", "invocation_duration_seconds", "retries_total", "dlq_entries_total",
	"missing_payload_total", "pending_entries", "pending_oldest_age_seconds",
	"in_flight_invocations", "concurrency_waits_total", "apps_unavailable", "held_messages",
	"claims_given_back_total",
	"schedule_occurrences_published_total", "schedule_occurrences_duplicate_total",
}

// deployDir holds the deployment files, from this package's directory.
var deployDir = filepath.Join("..", "..", "deploy", "observability")

// metricNames is a prometheus.Registerer that keeps the names of what is
// registered on it.
type metricNames struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *metricNames) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			return fmt.Errorf("no fqName in %s", d)
		}
		r.names[m[1]] = true
	}
	return nil
}

func (r *metricNames) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *metricNames) Unregister(prometheus.Collector) bool { return false }

// registeredMetrics returns the relay_ metric names relay start registers on its
// /metrics registry: an Engine's and the schedule counters. Nothing is run:
// the components are never called.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	apps, err := app.NewSet()
	if err != nil {
		t.Fatal(err)
	}
	r := &metricNames{names: map[string]bool{}}
	// worker.New registers everything relay start does and connects nowhere.
	_, err = worker.New(worker.Config{
		Redis: redistest.Client(t), Streams: []string{"events"}, Group: "relay", Consumer: "c1",
		Apps: worker.Static(apps), Runner: runtime.NewFunc(nil), Engine: relay.Config{Metrics: r},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.names) == 0 {
		t.Fatal("the Worker registered no metric")
	}
	return r.names
}

// dashboardPanel is the part of a Grafana panel the test reads.
type dashboardPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"` // a collapsed row's panels
}

var relayMetricRef = regexp.MustCompile(`\brelay_[a-z_]+`)

// histogramBase maps a histogram's series to the histogram.
func histogramBase(series string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, suffix); ok && strings.HasSuffix(base, "_seconds") {
			return base
		}
	}
	return series
}

// TestDeployGrafanaDashboard: every metric docs/observability.md lists has a
// panel, and every relay_ metric a panel queries exists.
func TestDeployGrafanaDashboard(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(deployDir, "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title      string           `json:"title"`
		UID        string           `json:"uid"`
		Panels     []dashboardPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if dash.Title == "" || dash.UID == "" {
		t.Errorf("dashboard title %q, uid %q: both must be set", dash.Title, dash.UID)
	}
	var vars []string
	for _, v := range dash.Templating.List {
		vars = append(vars, v.Name)
	}

	queried := map[string][]string{} // metric -> panel titles
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				names := relayMetricRef.FindAllString(tg.Expr, -1)
				if len(names) == 0 {
					t.Errorf("panel %q queries no relay_ metric: %s", p.Title, tg.Expr)
				}
				for _, n := range names {
					queried[histogramBase(n)] = append(queried[histogramBase(n)], p.Title)
				}
				for _, ref := range regexp.MustCompile(`\$(\w+)`).FindAllStringSubmatch(tg.Expr, -1) {
					if !strings.HasPrefix(ref[1], "__") && !slices.Contains(vars, ref[1]) {
						t.Errorf("panel %q uses $%s, which the dashboard does not define", p.Title, ref[1])
					}
				}
			}
		}
	}
	walk(dash.Panels)

	for _, m := range documentedMetricNames {
		if len(queried["relay_"+m]) == 0 {
			t.Errorf("no panel shows relay_%s (docs/observability.md#metrics)", m)
		}
	}
	reg := registeredMetrics(t)
	for m, panels := range queried {
		if !reg[m] {
			t.Errorf("panels %q query %s, which Relay does not register", panels, m)
		}
	}
	for m := range reg {
		if len(queried[m]) == 0 {
			t.Errorf("Relay registers %s but no panel shows it", m)
		}
	}
}

// TestDeployCollectorConfig parses the example collector configuration and checks
// that it receives OTLP over gRPC and HTTP on the standard ports and that
// its trace pipeline only names components it defines.
func TestDeployCollectorConfig(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(deployDir, "otel-collector.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Receivers  map[string]map[string]any `yaml:"receivers"`
		Processors map[string]any            `yaml:"processors"`
		Exporters  map[string]any            `yaml:"exporters"`
		Extensions map[string]any            `yaml:"extensions"`
		Service    struct {
			Extensions []string `yaml:"extensions"`
			Pipelines  map[string]struct {
				Receivers  []string `yaml:"receivers"`
				Processors []string `yaml:"processors"`
				Exporters  []string `yaml:"exporters"`
			} `yaml:"pipelines"`
		} `yaml:"service"`
	}
	if err := yaml.UnmarshalWithOptions(raw, &cfg, yaml.Strict()); err != nil {
		t.Fatalf("otel-collector.yaml: %v", err)
	}
	protocols, _ := cfg.Receivers["otlp"]["protocols"].(map[string]any)
	for proto, port := range map[string]string{"grpc": ":4317", "http": ":4318"} {
		p, _ := protocols[proto].(map[string]any)
		if ep, _ := p["endpoint"].(string); !strings.HasSuffix(ep, port) {
			t.Errorf("otlp receiver %s endpoint %q, want port %s", proto, ep, port)
		}
	}
	traces, ok := cfg.Service.Pipelines["traces"]
	if !ok {
		t.Fatal("no traces pipeline")
	}
	check := func(kind string, used []string, defined func(string) bool) {
		if len(used) == 0 {
			t.Errorf("traces pipeline has no %s", kind)
		}
		for _, name := range used {
			if !defined(name) {
				t.Errorf("traces pipeline uses %s %q, which is not defined", kind, name)
			}
		}
	}
	check("receivers", traces.Receivers, func(n string) bool { _, ok := cfg.Receivers[n]; return ok })
	check("processors", traces.Processors, func(n string) bool { _, ok := cfg.Processors[n]; return ok })
	check("exporters", traces.Exporters, func(n string) bool { _, ok := cfg.Exporters[n]; return ok })
	check("extensions", cfg.Service.Extensions, func(n string) bool { _, ok := cfg.Extensions[n]; return ok })
	if !slices.Contains(traces.Processors, "batch") {
		t.Error("traces pipeline does not batch")
	}
	if slices.Index(traces.Processors, "memory_limiter") > 0 {
		t.Error("memory_limiter must come first among the processors")
	}
}
