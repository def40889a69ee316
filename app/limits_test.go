package app_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher"
)

func TestParseRate(t *testing.T) {
	for in, want := range map[string]app.Rate{
		"100/s":     {Count: 100, Per: time.Second},
		"30/m":      {Count: 30, Per: time.Minute},
		"1/h":       {Count: 1, Per: time.Hour},
		"1000000/s": {Count: app.MaxRateCount, Per: time.Second},
	} {
		got, err := app.ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if got.String() != in {
			t.Errorf("%+v.String() = %q, want %q", got, got.String(), in)
		}
	}
	for in, want := range map[string]string{
		"100":                    `rate "100": want <count>/<s|m|h>, like 100/s`,
		"100/sec":                `rate "100/sec": want <count>/<s|m|h>`,
		"100/ms":                 `want <count>/<s|m|h>`,
		"100/1s":                 `want <count>/<s|m|h>`,
		"/s":                     `want <count>/<s|m|h>`,
		"-1/s":                   `want <count>/<s|m|h>`,
		"1.5/s":                  `want <count>/<s|m|h>`,
		" 1/s":                   `want <count>/<s|m|h>`,
		"0/s":                    `rate "0/s": the count must be between 1 and 1000000`,
		"1000001/s":              `the count must be between 1 and 1000000`,
		"99999999999999999999/s": `the count must be between 1 and 1000000`,
	} {
		if _, err := app.ParseRate(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRate(%q) = %v, want an error containing %q", in, err, want)
		}
	}
	if got := (app.Rate{Count: 3, Per: time.Second}).Interval(); got != 333333333*time.Nanosecond {
		t.Errorf("Interval of 3/s = %s", got)
	}
	if got := (app.Rate{}).Interval(); got != 0 {
		t.Errorf("Interval of the zero Rate = %s", got)
	}
}

func TestParseScope(t *testing.T) {
	for in, want := range map[string]app.Scope{"worker": app.ScopeWorker, "cluster": app.ScopeCluster} {
		if got, err := app.ParseScope(in); err != nil || got != want || got.String() != in {
			t.Errorf("ParseScope(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := app.ParseScope("global"); err == nil || !strings.Contains(err.Error(), `concurrency_scope "global": want worker`) {
		t.Errorf("ParseScope(global) = %v", err)
	}
}

func TestLimitsString(t *testing.T) {
	for _, c := range []struct {
		l    app.Limits
		want string
	}{
		{app.Limits{}, "{}"},
		{app.Limits{Concurrency: 3}, "{concurrency: 3}"},
		{app.Limits{Concurrency: 3, Scope: app.ScopeCluster}, "{concurrency: 3, concurrency_scope: cluster}"},
		{app.Limits{Concurrency: 2, Scope: app.ScopeCluster, ConcurrencyKey: "new_image.customer_id"}, "{concurrency: 2, concurrency_key: new_image.customer_id}"},
		{app.Limits{Rate: app.Rate{Count: 100, Per: time.Second}, RateBurst: 1, RateKey: "tenant"}, "{rate: 100/s, rate_burst: 1, rate_key: tenant}"},
		{app.Limits{Debounce: app.Debounce{Key: "id", Period: 90 * time.Second}, MaxAge: time.Hour}, "{debounce: {key: id, period: 1m30s}, max_age: 1h}"},
	} {
		if got := c.l.String(); got != c.want {
			t.Errorf("String() = %q, want %q", got, c.want)
		}
		if c.l.IsZero() != (c.want == "{}") {
			t.Errorf("%s: IsZero() = %v", c.want, c.l.IsZero())
		}
	}
}

// TestNewSetLimits: NewSet checks a rule's Limits as a template's keys
// are checked, naming the app and the handler, and fills their defaults.
func TestNewSetLimits(t *testing.T) {
	pattern := &matcher.Pattern{}
	build := func(l app.Limits) *app.App {
		return &app.App{Name: "orders", Concurrency: 4, Rules: []app.Rule{{Handler: "h.run", Pattern: pattern, Limits: l}}}
	}
	rate := app.Rate{Count: 100, Per: time.Second}
	for _, c := range []struct {
		name    string
		in, out app.Limits
	}{
		{"none", app.Limits{}, app.Limits{}},
		{"worker concurrency", app.Limits{Concurrency: 4}, app.Limits{Concurrency: 4}},
		{"cluster concurrency above the app's", app.Limits{Concurrency: 50, Scope: app.ScopeCluster}, app.Limits{Concurrency: 50, Scope: app.ScopeCluster}},
		{"a key makes the scope cluster", app.Limits{Concurrency: 2, ConcurrencyKey: "new_image.customer_id"},
			app.Limits{Concurrency: 2, Scope: app.ScopeCluster, ConcurrencyKey: "new_image.customer_id"}},
		{"default burst", app.Limits{Rate: rate, RateKey: "tenant"}, app.Limits{Rate: rate, RateBurst: 1, RateKey: "tenant"}},
		{"burst", app.Limits{Rate: rate, RateBurst: 20}, app.Limits{Rate: rate, RateBurst: 20}},
		{"debounce and max age", app.Limits{Debounce: app.Debounce{Key: `a\.b`, Period: 10 * time.Second}, MaxAge: time.Minute},
			app.Limits{Debounce: app.Debounce{Key: `a\.b`, Period: 10 * time.Second}, MaxAge: time.Minute}},
	} {
		a := build(c.in)
		if _, err := app.NewSet(a); err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if diff := cmp.Diff(c.out, a.Rules[0].Limits); diff != "" {
			t.Errorf("%s: Limits (-want +got):\n%s", c.name, diff)
		}
	}
	for _, c := range []struct {
		name string
		l    app.Limits
		want string
	}{
		{"negative concurrency", app.Limits{Concurrency: -1}, "Limits.Concurrency -1: want 0 (no bound of the rule's own) to 10000"},
		{"too much concurrency", app.Limits{Concurrency: 10001, Scope: app.ScopeCluster}, "Limits.Concurrency 10001"},
		{"above the app's", app.Limits{Concurrency: 5}, "Limits.Concurrency 5 on each worker is more than the app's Concurrency 4"},
		{"bad scope", app.Limits{Concurrency: 1, Scope: 7}, "Limits.Scope Scope(7): want app.ScopeWorker or app.ScopeCluster"},
		{"scope without concurrency", app.Limits{Scope: app.ScopeCluster}, "Limits.Scope cluster needs a Limits.Concurrency"},
		{"key without concurrency", app.Limits{ConcurrencyKey: "id"}, "Limits.ConcurrencyKey id needs a Limits.Concurrency"},
		{"bad concurrency key", app.Limits{Concurrency: 1, ConcurrencyKey: "a..b"}, `Limits.ConcurrencyKey: field path "a..b": key 2 is empty`},
		{"zero count", app.Limits{Rate: app.Rate{Per: time.Second}}, "Limits.Rate: Rate{Count: 0, Per: 1s}: want Count 1 to 1000000"},
		{"bad unit", app.Limits{Rate: app.Rate{Count: 1, Per: 10 * time.Second}}, "Per time.Second, time.Minute or time.Hour"},
		{"burst without rate", app.Limits{RateBurst: 2}, "Limits.RateBurst and Limits.RateKey need a Limits.Rate"},
		{"key without rate", app.Limits{RateKey: "id"}, "need a Limits.Rate"},
		{"bad burst", app.Limits{Rate: rate, RateBurst: 10001}, "Limits.RateBurst 10001: want 1 to 10000"},
		{"bad rate key", app.Limits{Rate: rate, RateKey: "a b"}, `Limits.RateKey: field path "a b": contains whitespace`},
		{"debounce without key", app.Limits{Debounce: app.Debounce{Period: time.Second}}, "Limits.Debounce.Key: field path is empty"},
		{"debounce without period", app.Limits{Debounce: app.Debounce{Key: "id"}}, "Limits.Debounce.Period: debounce period 0s: want at least 1ms and at most 24h"},
		{"debounce too long", app.Limits{Debounce: app.Debounce{Key: "id", Period: 25 * time.Hour}}, "debounce period 25h: want at least 1ms and at most 24h"},
		{"max age too short", app.Limits{MaxAge: time.Millisecond}, "Limits.MaxAge: max_age 1ms: want at least 1s"},
		{"negative max age", app.Limits{MaxAge: -time.Hour}, "max_age -1h: want at least 1s"},
		{"max age within the debounce", app.Limits{Debounce: app.Debounce{Key: "id", Period: time.Minute}, MaxAge: time.Minute},
			"Limits.MaxAge 1m is not longer than Limits.Debounce.Period 1m"},
	} {
		_, err := app.NewSet(build(c.l))
		if err == nil || !strings.HasPrefix(err.Error(), `app: app "orders" handler "h.run": `) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: NewSet = %v, want an error naming the rule and containing %q", c.name, err, c.want)
		}
	}
}
