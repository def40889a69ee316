// Package backtest runs apps' rules against the newest events of a stream,
// so a template change is tried on real traffic before it is deployed
// (docs/console.md#backtesting-patterns). It only reads the
// stream (XREVRANGE) and never touches a consumer group.
package backtest

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher"
)

// MaxWindow bounds the entries one backtest reads.
const MaxWindow = 10000

// Match is one matching entry.
type Match struct {
	ID    string `json:"id"`
	Event string `json:"event"`
}

// Rule is one rule's result.
type Rule struct {
	App     string `json:"app"`
	Handler string `json:"handler"`
	// Rule is the rule's index in its app's events list.
	Rule int `json:"rule"`
	// Matches counts the examined events the rule matched.
	Matches int `json:"matches"`
	// First holds the newest matches, at most the first argument of Run.
	First []Match `json:"first"`
}

// Result is what the rules matched among the newest entries of a stream.
type Result struct {
	// Examined counts the entries read, newest first, from Newest back to
	// Oldest (stream ids; empty when the stream is empty).
	Examined int    `json:"examined"`
	Newest   string `json:"newest,omitempty"`
	Oldest   string `json:"oldest,omitempty"`
	// Matched counts events that matched at least one rule, Unmatched the
	// others, Malformed the entries a worker would dead-letter as
	// malformed (no "event" field, not a JSON object, or larger than its
	// MAX_EVENT_BYTES).
	Matched   int `json:"matched"`
	Unmatched int `json:"unmatched"`
	Malformed int `json:"malformed"`
	// Rules lists every rule of the apps in dispatch order, matched or not.
	Rules []Rule `json:"rules"`
}

// Run matches the newest n entries of stream (1 ≤ n ≤ MaxWindow) against
// every rule of apps, with now() cutoffs relative to now, and keeps the
// first k matches of each rule. An event larger than maxEventBytes (the
// workers' MAX_EVENT_BYTES; <= 0: no limit) counts as malformed, as the
// workers dead-letter it undecoded. A rule whose pattern did not load
// matches nothing.
func Run(ctx context.Context, client rueidis.Client, stream string, apps *app.Set, n, k, maxEventBytes int, now time.Time) (Result, error) {
	if n < 1 || n > MaxWindow {
		return Result{}, fmt.Errorf("backtest: window of %d entries: must be 1 to %d", n, MaxWindow)
	}
	entries, err := client.Do(ctx, client.B().Xrevrange().Key(stream).End("+").Start("-").Count(int64(n)).Build()).AsXRange()
	if err != nil {
		return Result{}, fmt.Errorf("backtest: read the newest %d entries of %s: %w", n, stream, err)
	}
	var res Result
	index := map[matcher.Target]int{}
	for _, a := range apps.List() {
		for i, r := range a.Rules {
			t := matcher.Target{App: a.Name, Handler: r.Handler, Rule: i}
			index[t] = len(res.Rules)
			res.Rules = append(res.Rules, Rule{App: t.App, Handler: t.Handler, Rule: t.Rule, First: []Match{}})
		}
	}
	set := apps.Matcher()
	res.Examined = len(entries)
	if len(entries) > 0 {
		res.Newest, res.Oldest = entries[0].ID, entries[len(entries)-1].ID
	}
	for _, e := range entries {
		event, ok := e.FieldValues["event"]
		if !ok || maxEventBytes > 0 && len(event) > maxEventBytes {
			res.Malformed++
			continue
		}
		targets, err := set.MatchAt([]byte(event), now)
		switch {
		case err != nil:
			res.Malformed++
			continue
		case len(targets) == 0:
			res.Unmatched++
			continue
		}
		res.Matched++
		for _, t := range targets {
			i, ok := index[t]
			if !ok {
				continue // not a rule of apps: cannot happen with its own matcher
			}
			r := &res.Rules[i]
			r.Matches++
			if len(r.First) < k {
				r.First = append(r.First, Match{ID: e.ID, Event: event})
			}
		}
	}
	return res, nil
}
