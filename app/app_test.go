package app_test

import (
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule/cron"
)

// Apps defined in Go follow the template's rule that warm containers need
// a language runtime.
func TestNewSetWarm(t *testing.T) {
	a := &app.App{Name: "orders", Spec: runtime.Spec{Image: "x", Warm: true}}
	if _, err := app.NewSet(a); err == nil || !strings.Contains(err.Error(), "Spec.Warm needs Spec.Runtime") {
		t.Fatalf("warm without runtime: got %v", err)
	}
	a.Spec.Runtime = runtime.RuntimeNode
	if _, err := app.NewSet(a); err != nil {
		t.Fatalf("warm with runtime: %v", err)
	}
}

func TestNewSet(t *testing.T) {
	pattern := &matcher.Pattern{}
	good := func() *app.App {
		return &app.App{Name: "orders", Rules: []app.Rule{{Handler: "h.run", Pattern: pattern}},
			Schedules: []app.Schedule{{Name: "nightly", Handler: "h.nightly", Cron: cron.MustParse("0 3 * * *", nil)}}}
	}
	a := good()
	set, err := app.NewSet(a, &app.App{Name: "billing", Rules: []app.Rule{{Handler: "b.run", Pattern: pattern}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := set.List(); len(got) != 2 || got[0].Name != "billing" || got[1].Name != "orders" {
		t.Errorf("List is not in name order: %v", got)
	}
	if a.Concurrency != app.DefaultConcurrency || a.Rules[0].Timeout != app.DefaultTimeout || a.Schedules[0].Timeout != app.DefaultTimeout {
		t.Errorf("defaults not filled: %+v", a)
	}
	if a.RuleIndex("h.run") != 0 || a.RuleIndex("nope") != -1 || (*app.App)(nil).RuleIndex("h.run") != -1 {
		t.Error("RuleIndex")
	}
	if s := a.Schedule("nightly"); s == nil || s.Timezone() != time.UTC {
		t.Errorf("Schedule(nightly) = %+v", s)
	}
	if specs := set.ScheduleSpecs(); len(specs) != 1 || specs[0].App != "orders" || specs[0].Cron.String() != "0 3 * * *" {
		t.Errorf("ScheduleSpecs = %+v", specs)
	}

	for name, c := range map[string]struct {
		mod  func(*app.App)
		want string
	}{
		"bad name":          {func(a *app.App) { a.Name = "Orders" }, `app name "Orders"`},
		"nil pattern":       {func(a *app.App) { a.Rules[0].Pattern = nil }, "nil pattern"},
		"duplicate handler": {func(a *app.App) { a.Rules = append(a.Rules, a.Rules[0]) }, `handler "h.run" defined twice`},
		"negative retries":  {func(a *app.App) { a.Rules[0].Retries = -1 }, "retries must be >= 0"},
		"schedule no cron":  {func(a *app.App) { a.Schedules[0].Cron = nil }, "needs a valid name, a handler and a Cron"},
	} {
		a := good()
		c.mod(a)
		if _, err := app.NewSet(a); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: NewSet = %v, want an error containing %q", name, err, c.want)
		}
	}
	if _, err := app.NewSet(good(), good()); err == nil || !strings.Contains(err.Error(), "defined twice") {
		t.Errorf("duplicate app: %v", err)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1KiB": 1024, "256MiB": 256 << 20, "2GiB": 2 << 30} {
		if got, err := app.ParseSize("size", in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "1", "1MB", "0MiB", "-1KiB", "1.5MiB", "99999999999999GiB"} {
		if _, err := app.ParseSize("size", in); err == nil {
			t.Errorf("ParseSize(%q): no error", in)
		}
	}
}
