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
	// The template's defaults: a rule written in Go without Retries is
	// retried as one in a template.yaml without retries is.
	if a.Concurrency != app.DefaultConcurrency || a.Rules[0].Timeout != app.DefaultTimeout || a.Schedules[0].Timeout != app.DefaultTimeout ||
		a.Rules[0].Retries != app.DefaultRetries || a.Schedules[0].Retries != app.DefaultRetries {
		t.Errorf("defaults not filled: %+v", a)
	}
	// NewSet again (a second set of the same app) does not fill again.
	if _, err := app.NewSet(a); err != nil || a.Rules[0].Retries != app.DefaultRetries {
		t.Errorf("second NewSet: %v, retries %d", err, a.Rules[0].Retries)
	}
	none := good()
	none.Rules[0].Retries, none.Schedules[0].Retries = app.NoRetries, app.NoRetries
	if _, err := app.NewSet(none); err != nil || none.Rules[0].Retries != 0 || none.Schedules[0].Retries != 0 {
		t.Errorf("NoRetries: %v, rule retries %d, schedule retries %d; want 0", err, none.Rules[0].Retries, none.Schedules[0].Retries)
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
		"bad name":           {func(a *app.App) { a.Name = "Orders" }, `app name "Orders"`},
		"nil pattern":        {func(a *app.App) { a.Rules[0].Pattern = nil }, "nil pattern"},
		"duplicate handler":  {func(a *app.App) { a.Rules = append(a.Rules, a.Rules[0]) }, `handler "h.run" defined twice`},
		"negative retries":   {func(a *app.App) { a.Rules[0].Retries = -2 }, "retries -2 must be between 0 and 1000"},
		"too many retries":   {func(a *app.App) { a.Schedules[0].Retries = 1001 }, "retries 1001 must be between 0 and 1000"},
		"negative Retry":     {func(a *app.App) { a.Rules[0].Retry = app.Retries(-1) }, "app.Retries(-1): must be between 0 and 1000"},
		"too large Retry":    {func(a *app.App) { a.Schedules[0].Retry = app.Retries(1001) }, "app.Retries(1001): must be between 0 and 1000"},
		"Retry and Retries":  {func(a *app.App) { a.Rules[0].Retry, a.Rules[0].Retries = app.Retries(1), 3 }, "set Retry only"},
		"schedule no cron":   {func(a *app.App) { a.Schedules[0].Cron = nil }, "needs a valid name unique in the app and a Cron"},
		"timeout too long":   {func(a *app.App) { a.Rules[0].Timeout = 20 * time.Minute }, "timeout 20m0s is longer than the maximum 15m0s"},
		"negative timeout":   {func(a *app.App) { a.Schedules[0].Timeout = -time.Second }, "timeout -1s must be > 0"},
		"bad handler":        {func(a *app.App) { a.Rules[0].Handler = "h/run" }, `handler "h/run" must be non-empty, without /`},
		"schedule handler":   {func(a *app.App) { a.Schedules[0].Handler = "" }, `handler "" must be non-empty`},
		"container handler":  {func(a *app.App) { a.Spec.Image = "docker.io/library/busybox:1.36"; a.Rules[0].Handler = "run" }, `handler "run" must be module.function`},
		"duplicate schedule": {func(a *app.App) { a.Schedules = append(a.Schedules, a.Schedules[0]) }, "unique in the app"},
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

// TestRetry: a rule defined in Go says default, none or n retries through
// its Retry, whose zero value is the default and whose none is
// Retries(0), not a number that reads as none and means 4
// (docs/embedding.md#apps-in-go).
func TestRetry(t *testing.T) {
	pattern := &matcher.Pattern{}
	for _, c := range []struct {
		retry app.Retry
		want  int
		text  string
	}{
		{app.Retry{}, app.DefaultRetries, "default (4)"},
		{app.Retries(0), 0, "0"},
		{app.Retries(2), 2, "2"},
		{app.Retries(app.MaxRetries), app.MaxRetries, "1000"},
	} {
		a := &app.App{Name: "orders", Rules: []app.Rule{{Handler: "h.run", Pattern: pattern, Retry: c.retry}},
			Schedules: []app.Schedule{{Name: "nightly", Handler: "h.nightly", Cron: cron.MustParse("@daily", nil), Retry: c.retry}}}
		if _, err := app.NewSet(a); err != nil {
			t.Fatalf("Retry %v: %v", c.retry, err)
		}
		if a.Rules[0].Retries != c.want || a.Schedules[0].Retries != c.want || c.retry.Count() != c.want || c.retry.String() != c.text ||
			c.retry.IsDefault() != (c.text == "default (4)") {
			t.Errorf("Retry %v: rule retries %d, schedule retries %d, Count %d, String %q; want %d, %q",
				c.retry, a.Rules[0].Retries, a.Schedules[0].Retries, c.retry.Count(), c.retry.String(), c.want, c.text)
		}
	}
}
