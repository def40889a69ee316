package relaytest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/relaydev/relay/app"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
)

// TestMatcher runs the contract of relay.Matcher (docs/apps.md#patterns;
// the dispatch order of docs/delivery.md#from-entry-to-acknowledgement)
// against the matchers newMatcher builds for the apps it is given, one per
// parallel sub-test.
//
// It covers: every matching rule reported, apps in sorted name order and
// rules in declaration order, with the rule's handler and its index in its
// app; no deduplication across rules and apps; an unmatched event as an
// empty result without error; anything but one JSON object (an array, a
// string, null, invalid JSON, trailing data, nothing) as an error wrapping
// matcher.ErrMalformed; and concurrent matches agreeing.
func TestMatcher(t *testing.T, newMatcher func(t *testing.T, apps *app.Set) relay.Matcher) {
	for _, c := range matcherCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := newMatcher(t, contractApps(t))
			if m == nil {
				t.Fatal("relaytest: newMatcher returned nil")
			}
			c.run(t, m)
		})
	}
}

// matcherCases are the cases of TestMatcher, in the order they run. Each is a
// function below named matcher<case>; a failure names the calling test and
// the case.
var matcherCases = []struct {
	name string
	run  func(t *testing.T, m relay.Matcher)
}{
	{"DispatchOrder", matcherDispatchOrder},
	{"OnlyMatchingRules", matcherOnlyMatchingRules},
	{"Unmatched", matcherUnmatched},
	{"Malformed", matcherMalformed},
	{"Concurrent", matcherConcurrent},
}

func matcherDispatchOrder(t *testing.T, m relay.Matcher) {
	got := match(t, m, `{"type":"signup","plan":"pro","email":"ada@example.com"}`)
	want := []matcher.Target{
		{App: "alpha", Handler: "first", Rule: 0},
		{App: "alpha", Handler: "third", Rule: 2},
		{App: "mid", Handler: "only", Rule: 0},
		{App: "zeta", Handler: "any.signup", Rule: 0},
		{App: "zeta", Handler: "pro.signup", Rule: 1},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Match = %v, want %v (apps sorted by name, rules in declaration order)", got, want)
	}
}

func matcherOnlyMatchingRules(t *testing.T, m relay.Matcher) {
	got := match(t, m, `{"type":"signup","plan":"free","email":"bob@elsewhere.org"}`)
	want := []matcher.Target{
		{App: "alpha", Handler: "first", Rule: 0},
		{App: "zeta", Handler: "any.signup", Rule: 0},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Match = %v, want %v", got, want)
	}
}

func matcherUnmatched(t *testing.T, m relay.Matcher) {
	for _, ev := range []string{`{"type":"logout"}`, `{}`, ` {"unrelated": [1, 2]} `} {
		if got := match(t, m, ev); len(got) != 0 {
			t.Errorf("Match(%s) = %v, want no targets", ev, got)
		}
	}
}

func matcherMalformed(t *testing.T, m relay.Matcher) {
	for _, ev := range []string{`["type","signup"]`, `"signup"`, `null`, `42`, `{"type":`, `{"type":"signup"} {}`, ``, `   `} {
		got, err := m.Match([]byte(ev))
		if !errors.Is(err, matcher.ErrMalformed) || len(got) != 0 {
			t.Errorf("Match(%q) = %v, %v; want no targets and matcher.ErrMalformed", ev, got, err)
		}
	}
}

func matcherConcurrent(t *testing.T, m relay.Matcher) {
	want := fmt.Sprint(match(t, m, `{"type":"signup","plan":"pro"}`))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				got, err := m.Match([]byte(`{"type":"signup","plan":"pro"}`))
				if err != nil || fmt.Sprint(got) != want {
					t.Errorf("concurrent Match = %v, %v; want %s", got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

// contractApps are three apps given out of name order, with rules that an
// event can match several of.
func contractApps(t *testing.T) *app.Set {
	t.Helper()
	rule := func(handler, pattern string) app.Rule {
		t.Helper()
		p, err := yamlpattern.Parse("relaytest.yaml", []byte(pattern))
		if err != nil {
			t.Fatalf("pattern %s: %v", pattern, err)
		}
		return app.Rule{Handler: handler, Pattern: p}
	}
	apps, err := app.NewSet(
		&app.App{Name: "zeta", Rules: []app.Rule{
			rule("any.signup", `{type: [signup]}`),
			rule("pro.signup", `{type: [signup], plan: [pro]}`),
		}},
		&app.App{Name: "alpha", Rules: []app.Rule{
			rule("first", `{type: [signup]}`),
			rule("second", `{type: [login]}`),
			rule("third", `{email: [{suffix: "@example.com"}]}`),
		}},
		&app.App{Name: "mid", Rules: []app.Rule{
			rule("only", `{plan: [pro, enterprise], type: [{prefix: "sign"}]}`),
		}},
	)
	if err != nil {
		t.Fatal(err)
	}
	return apps
}

func match(t *testing.T, m relay.Matcher, event string) []matcher.Target {
	t.Helper()
	got, err := m.Match([]byte(event))
	if err != nil {
		t.Fatalf("Match(%s): %v", event, err)
	}
	return got
}
