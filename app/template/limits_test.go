package template_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/matcher"
)

// rules is a template's head and event rules: each rule handler a.rN
// with its own pattern, then the lines given, indented under it.
func rules(head string, ruleLines ...string) string {
	var b strings.Builder
	b.WriteString(head)
	b.WriteString("events:\n")
	for i, lines := range ruleLines {
		b.WriteString("  - handler: a.r" + string(rune('0'+i)) + "\n    pattern: {k: [v" + string(rune('0'+i)) + "]}\n")
		for l := range strings.SplitSeq(lines, "\n") {
			if l != "" {
				b.WriteString("    " + l + "\n")
			}
		}
	}
	return b.String()
}

// TestLimits: the flow-control keys of each rule, over the app's
// defaults, key by key.
func TestLimits(t *testing.T) {
	perS := func(n int) app.Rate { return app.Rate{Count: n, Per: time.Second} }
	for _, c := range []struct {
		name string
		src  string
		want []app.Limits // per rule
	}{
		{"none", rules("image: x\n", ""), []app.Limits{{}}},
		{"concurrency per worker", rules("image: x\nconcurrency: 4\n", "concurrency: 3"), []app.Limits{{Concurrency: 3}}},
		{"concurrency across the cluster", rules("image: x\n", "concurrency: 40\nconcurrency_scope: cluster"),
			[]app.Limits{{Concurrency: 40, Scope: app.ScopeCluster}}},
		{"explicit worker scope", rules("image: x\n", "concurrency: 1\nconcurrency_scope: worker"), []app.Limits{{Concurrency: 1}}},
		{"concurrency per key", rules("image: x\n", "concurrency: 2\nconcurrency_key: new_image.customer_id"),
			[]app.Limits{{Concurrency: 2, Scope: app.ScopeCluster, ConcurrencyKey: "new_image.customer_id"}}},
		{"per key, scope said", rules("image: x\n", "concurrency: 2\nconcurrency_key: 'meta.a\\.b'\nconcurrency_scope: cluster"),
			[]app.Limits{{Concurrency: 2, Scope: app.ScopeCluster, ConcurrencyKey: `meta.a\.b`}}},
		{"rate units", rules("image: x\n", "rate: 100/s", "rate: 30/m\nrate_burst: 5", "rate: 1000/h\nrate_key: tenant"), []app.Limits{
			{Rate: perS(100), RateBurst: 1},
			{Rate: app.Rate{Count: 30, Per: time.Minute}, RateBurst: 5},
			{Rate: app.Rate{Count: 1000, Per: time.Hour}, RateBurst: 1, RateKey: "tenant"}}},
		{"app defaults, overridden key by key",
			rules("image: x\nrate: 10/s\nrate_key: tenant\nmax_age: 1h\ndebounce: {key: id, period: 5s}\n",
				"", "rate: 50/s", "rate_key: user\nmax_age: 2h", "rate: none\nmax_age: none\ndebounce: none", "debounce: {key: other, period: 1m}"),
			[]app.Limits{
				{Rate: perS(10), RateBurst: 1, RateKey: "tenant", Debounce: app.Debounce{Key: "id", Period: 5 * time.Second}, MaxAge: time.Hour},
				{Rate: perS(50), RateBurst: 1, RateKey: "tenant", Debounce: app.Debounce{Key: "id", Period: 5 * time.Second}, MaxAge: time.Hour},
				{Rate: perS(10), RateBurst: 1, RateKey: "user", Debounce: app.Debounce{Key: "id", Period: 5 * time.Second}, MaxAge: 2 * time.Hour},
				{},
				{Rate: perS(10), RateBurst: 1, RateKey: "tenant", Debounce: app.Debounce{Key: "other", Period: time.Minute}, MaxAge: time.Hour},
			}},
		{"app default of a key applies only with a rate", rules("image: x\nrate_key: tenant\nrate_burst: 3\n", "rate: 5/s", ""),
			[]app.Limits{{Rate: perS(5), RateBurst: 3, RateKey: "tenant"}, {}}},
		{"defaults written after the rules", "image: x\nevents:\n  - {handler: a.b, pattern: {k: [v]}}\nmax_age: 10m\n",
			[]app.Limits{{MaxAge: 10 * time.Minute}}},
		{"debounce in block style", rules("image: x\n", "debounce:\n  key: new_image.id\n  period: 10s\nmax_age: 11s"),
			[]app.Limits{{Debounce: app.Debounce{Key: "new_image.id", Period: 10 * time.Second}, MaxAge: 11 * time.Second}}},
		{"everything", rules("runtime: python3\nwarm: true\nconcurrency: 8\n",
			"concurrency: 2\nconcurrency_key: new_image.customer_id\nrate: 100/s\nrate_burst: 20\nrate_key: new_image.customer_id\ndebounce: {key: new_image.id, period: 2s}\nmax_age: 1h"),
			[]app.Limits{{Concurrency: 2, Scope: app.ScopeCluster, ConcurrencyKey: "new_image.customer_id", Rate: perS(100), RateBurst: 20,
				RateKey: "new_image.customer_id", Debounce: app.Debounce{Key: "new_image.id", Period: 2 * time.Second}, MaxAge: time.Hour}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := apptest.One(t, "app", c.src)
			if !a.Available() {
				t.Fatalf("errors:\n%v", a.Errors)
			}
			var got []app.Limits
			for _, r := range a.Rules {
				got = append(got, r.Limits)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("Limits (-want +got):\n%s", diff)
			}
			// A set built in Go from the same Limits agrees with the template.
			for i, r := range a.Rules {
				g := &app.App{Name: "app", Concurrency: a.Concurrency, Spec: a.Spec, Rules: []app.Rule{{Handler: r.Handler, Pattern: r.Pattern, Limits: r.Limits}}}
				if _, err := app.NewSet(g); err != nil {
					t.Errorf("NewSet of rule %d's Limits: %v", i, err)
				} else if g.Rules[0].Limits != r.Limits {
					t.Errorf("NewSet changed rule %d's Limits: %s, from %s", i, g.Rules[0].Limits, r.Limits)
				}
			}
		})
	}
}

// TestLimitsErrors: each invalid template gives exactly these errors, as
// "line:col: path: message" fragments, one per error.
func TestLimitsErrors(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      []string
	}{
		{"concurrency out of range", rules("image: x\n", "concurrency: 0", "concurrency: 10001\nconcurrency_scope: cluster"),
			[]string{`5:18: events[0].concurrency: concurrency must be a positive integer (at most 10000)`, `8:18: events[1].concurrency: concurrency must be a positive integer (at most 10000)`}},
		{"concurrency above the app's", rules("image: x\nconcurrency: 3\n", "concurrency: 4"),
			[]string{`6:18: events[0].concurrency: concurrency 4 on each worker is more than the app's concurrency 3, which bounds this rule too, so it would never apply: lower it, raise the app's concurrency, or set concurrency_scope: cluster`}},
		{"concurrency above the default", rules("image: x\n", "concurrency: 3"),
			[]string{`5:18: events[0].concurrency: concurrency 3 on each worker is more than the app's concurrency 2`}},
		{"concurrency not a number", rules("image: x\n", "concurrency: many"),
			[]string{`5:18: events[0].concurrency: must be a whole number, not the string "many"`}},
		{"bad scope", rules("image: x\n", "concurrency: 1\nconcurrency_scope: global"),
			[]string{`6:24: events[0].concurrency_scope: concurrency_scope "global": want worker (a bound on each worker, the default) or cluster (one bound across all workers)`}},
		{"scope without concurrency", rules("image: x\n", "concurrency_scope: cluster"),
			[]string{`5:24: events[0].concurrency_scope: concurrency_scope needs concurrency in the same rule: the bound it scopes, like concurrency: 5`}},
		{"key without concurrency", rules("image: x\n", "concurrency_key: new_image.customer_id"),
			[]string{`5:22: events[0].concurrency_key: concurrency_key needs concurrency in the same rule: the bound on runs per key, like concurrency: 2`}},
		{"key with worker scope", rules("image: x\n", "concurrency: 2\nconcurrency_key: id\nconcurrency_scope: worker"),
			[]string{`7:24: events[0].concurrency_scope: concurrency_scope: worker does not go with concurrency_key: a bound per key holds across all workers`}},
		{"bad key paths", rules("image: x\n", "concurrency: 2\nconcurrency_key: a..b", "rate: 1/s\nrate_key: '\\prefix'", "rate: 1/s\nrate_key: 'a b'", "rate: 1/s\nrate_key: 7"),
			[]string{`6:22: events[0].concurrency_key: concurrency_key: field path "a..b": key 2 is empty; write the keys separated by single dots, like new_image.customer_id (a key with a dot is written a\.b)`,
				`10:15: events[1].rate_key: rate_key: field path "\\prefix": a backslash escapes only a dot (\.) or a backslash (\\) inside a key; operator names need no backslash in a path`,
				`14:15: events[2].rate_key: rate_key: field path "a b": contains whitespace or a control character at byte 1`,
				`18:15: events[3].rate_key: must be a string, not a number`}},
		{"rates", rules("image: x\n", "rate: 100/sec", "rate: 100", "rate: 0/s", "rate: 2000000/s", "rate: 1.5/s", "rate: [1, s]"),
			[]string{`5:11: events[0].rate: rate "100/sec": want <count>/<s|m|h>, like 100/s`,
				`8:11: events[1].rate: rate 100: want <count>/<s|m|h>, like 100/s`,
				`11:11: events[2].rate: rate "0/s": the count must be between 1 and 1000000`,
				`14:11: events[3].rate: rate "2000000/s": the count must be between 1 and 1000000`,
				`17:11: events[4].rate: rate "1.5/s": want <count>/<s|m|h>, like 100/s`,
				`20:11: events[5].rate: must be a string, not a list`}},
		{"bursts", rules("image: x\n", "rate: 1/s\nrate_burst: 0", "rate: 1/s\nrate_burst: 10001", "rate: 1/s\nrate_burst: 1.5"),
			[]string{`6:17: events[0].rate_burst: rate_burst must be between 1 and 10000: how many invocations may start at once (default 1)`,
				`10:17: events[1].rate_burst: rate_burst must be between 1 and 10000`,
				`14:17: events[2].rate_burst: must be a whole number, not the fraction 1.5`}},
		{"rate companions without a rate", rules("image: x\n", "rate_burst: 5", "rate_key: tenant"),
			[]string{`5:17: events[0].rate_burst: rate_burst needs a rate: write rate: <count>/<s|m|h>, like rate: 100/s, in this rule or at the top of the template`,
				`8:15: events[1].rate_key: rate_key needs a rate`}},
		{"rate companion in a rule whose rate is none", rules("image: x\nrate: 1/s\n", "rate: none\nrate_key: tenant"),
			[]string{`7:15: events[0].rate_key: rate_key needs a rate, and this rule's rate is none: remove rate_key`}},
		{"top-level companions without any rate", rules("image: x\nrate_key: tenant\nrate_burst: 2\n", "", ""),
			[]string{`2:11: rate_key: rate_key is a default for the rules' rate, and no rule has a rate: set rate too, at the top or in a rule`,
				`3:13: rate_burst: rate_burst is a default for the rules' rate, and no rule has a rate`}},
		{"a bad rate is reported alone", rules("image: x\nrate: 5\nrate_key: tenant\n", "rate_burst: 2"),
			[]string{`2:7: rate: rate 5: want <count>/<s|m|h>, like 5/s`}},
		{"debounce shapes", rules("image: x\n", "debounce: 10s", "debounce: {key: id}", "debounce: {period: 1s}", "debounce: {key: id, period: 1s, every: 2s}", "debounce: {key: '', period: 1s}"),
			[]string{`5:15: events[0].debounce: debounce must be {key: <field path>, period: <duration>}, like {key: new_image.id, period: 10s}, or none, not the string "10s"`,
				`8:15: events[1].debounce: debounce needs period: how long an event waits for a successor with its key, like period: 10s`,
				`11:15: events[2].debounce: debounce needs key: the field path whose value groups the events, like key: new_image.id (events without the field share one group)`,
				`14:37: events[3].debounce.every: unknown key "every"; allowed keys: key, period`,
				`17:21: events[4].debounce.key: debounce key: field path is empty`}},
		{"debounce periods", rules("image: x\n", "debounce: {key: id, period: 25h}", "debounce: {key: id, period: 10}", "debounce: {key: id, period: 0s}", "debounce: {key: id, period: 1us}", "debounce: {key: id, period: soon}"),
			[]string{`5:33: events[0].debounce.period: debounce period 25h: want at least 1ms and at most 24h`,
				`8:33: events[1].debounce.period: a duration needs a unit: write 10s for seconds`,
				`11:33: events[2].debounce.period: must be > 0`,
				`14:33: events[3].debounce.period: debounce period 1µs: want at least 1ms and at most 24h`,
				`17:33: events[4].debounce.period: invalid duration "soon"`}},
		{"max ages", rules("image: x\n", "max_age: 500ms", "max_age: 60", "max_age: -1h", "max_age: [1h]"),
			[]string{`5:14: events[0].max_age: max_age 500ms: want at least 1s (0 for none)`,
				`8:14: events[1].max_age: a duration needs a unit: write 60s for seconds`,
				`11:14: events[2].max_age: must be > 0`,
				`14:14: events[3].max_age: must be a string, not a list`}},
		{"max age within the debounce period", rules("image: x\n", "debounce: {key: id, period: 10s}\nmax_age: 10s"),
			[]string{`6:14: events[0].max_age: max_age 10s is not longer than debounce.period 10s: every debounced event waits the period before it runs, so each would be dead-lettered; make max_age longer than the period`}},
		{"the rule's debounce against the app's max age", rules("image: x\nmax_age: 5s\n", "debounce: {key: id, period: 10s}", "debounce: {key: id, period: 1m}"),
			[]string{`6:15: events[0].debounce: max_age 5s is not longer than debounce.period 10s`, `9:15: events[1].debounce: max_age 5s is not longer than debounce.period 1m`}},
		{"the app's debounce against its max age, said once", rules("image: x\nmax_age: 5s\ndebounce: {key: id, period: 10s}\n", "", ""),
			[]string{`2:10: max_age: max_age 5s is not longer than debounce.period 10s`}},
		{"concurrency keys at the top", rules("image: x\nconcurrency_scope: cluster\nconcurrency_key: id\n", ""),
			[]string{`2:1: concurrency_scope: concurrency_scope belongs in an event rule, beside that rule's concurrency: the top-level concurrency bounds the app's invocations on each worker, all rules together (docs/flow-control.md)`,
				`3:1: concurrency_key: concurrency_key belongs in an event rule`}},
		{"typos", rules("image: x\nmax_ages: 1h\n", "rate_limit: 1/s", "debouce: {key: id, period: 1s}"),
			[]string{`2:1: max_ages: unknown key "max_ages" (did you mean "max_age"?)`,
				`6:5: events[0].rate_limit: unknown key "rate_limit" (did you mean "rate"?)`,
				`9:5: events[1].debouce: unknown key "debouce" (did you mean "debounce"?)`}},
		{"schedules take no flow control", "image: x\nmax_age: 1h\nschedules:\n  - name: nightly\n    handler: jobs.run\n    cron: '@daily'\n    max_age: 1h\n    concurrency: 1\n    debounce: {key: id, period: 1s}\n",
			[]string{`7:5: schedules[0].max_age: max_age applies to event rules only: a schedule takes no flow-control keys, and the app's defaults do not apply to its occurrences, each published once (docs/flow-control.md)`,
				`8:5: schedules[0].concurrency: concurrency applies to event rules only`,
				`9:5: schedules[0].debounce: debounce applies to event rules only`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := apptest.One(t, "app", c.src)
			var got []string
			for _, e := range a.Errors {
				got = append(got, e.Error())
			}
			if len(got) != len(c.want) {
				t.Errorf("%d errors, want %d:\n%s", len(got), len(c.want), strings.Join(got, "\n"))
			}
			for i, w := range c.want {
				if i < len(got) && !strings.HasPrefix(got[i], "app/template.yaml:"+w) {
					t.Errorf("error %d:\n got %s\nwant app/template.yaml:%s...", i, got[i], w)
				}
			}
		})
	}
}

// TestLimitsOfBrokenRules: a rule whose pattern is broken is not added,
// yet its flow-control keys are checked, and the other rules keep theirs.
func TestLimitsOfBrokenRules(t *testing.T) {
	a := apptest.One(t, "app", "image: x\nevents:\n  - {handler: a.b, pattern: {k: v}, rate: 1/sec}\n  - {handler: a.c, pattern: {k: [v]}, rate: 2/s}\n")
	if len(a.Rules) != 1 || a.Rules[0].Handler != "a.c" || a.Rules[0].Limits.Rate != (app.Rate{Count: 2, Per: time.Second}) {
		t.Fatalf("rules: %+v", a.Rules)
	}
	if len(a.Errors) != 2 || !strings.HasPrefix(a.Errors[1].Error(), `app/template.yaml:3:43: events[0].rate: rate "1/sec"`) {
		t.Errorf("errors: %q", []*matcher.PosError(a.Errors))
	}
}
