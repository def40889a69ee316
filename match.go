package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/matcher"
)

// malformedField is the invocation field of a malformed message; it gives
// the malformed path the same idempotent DLQ marker as handler invocations.
const malformedField = dlq.MalformedName + "/" + dlq.MalformedName

// plan is what the match stage found for one event: the invocations to
// drive, in dispatch order, and the unfinished ones whose app or rule is no
// longer loaded.
type plan struct {
	calls   []call
	orphans []string
	// unknown lists targets the Matcher returned that name no loaded rule.
	unknown []matcher.Target
	// malformed says why the event is not a JSON object; it is then
	// dead-lettered instead.
	malformed string
}

func (p plan) empty() bool { return len(p.calls) == 0 && len(p.orphans) == 0 && len(p.unknown) == 0 }

// match is the second stage of an external event's delivery: every rule the
// event matches, apps in name order and rules in declaration order
// (docs/delivery.md#from-entry-to-acknowledgement), plus, on a redelivery,
// every invocation an earlier delivery left unfinished. An event that is not
// a JSON object gets a plan with only malformed set; a hold says the message
// must stay pending because classifying it failed.
func (e *Engine) match(ctx context.Context, d *delivery) (plan, *hold) {
	targets, err := d.gen.matcher.Match([]byte(d.event))
	if errors.Is(err, matcher.ErrMalformed) {
		// The reason is read by operators in relay dlq ls; drop the
		// package prefix.
		return plan{malformed: strings.TrimPrefix(err.Error(), "matcher: ")}, nil
	}
	if err != nil {
		// Not the message's fault: leave it pending for a later delivery.
		return plan{}, &hold{level: slog.LevelError, msg: "match failed; message left pending", err: err}
	}
	targets, orphans, err := e.withUnfinished(ctx, d, targets)
	if err != nil {
		return plan{}, &hold{level: slog.LevelError, msg: "reading the message's unfinished invocations failed; message left pending", err: err}
	}
	p := plan{orphans: orphans}
	for _, t := range targets {
		a := d.gen.apps.Get(t.App)
		if a == nil || t.Rule < 0 || t.Rule >= len(a.Rules) {
			p.unknown = append(p.unknown, t)
			continue
		}
		r := a.Rules[t.Rule]
		p.calls = append(p.calls, call{app: a.Name, handler: r.Handler, timeout: r.Timeout, retries: r.Retries, input: []byte(d.event)})
	}
	return p, nil
}

// withUnfinished adds to targets, on a redelivery, the invocations the
// state store records as unfinished that this match did not return. The
// event was classified at its first delivery: a now() cutoff that passed
// since, or a changed template, must not drop an invocation that waits for
// its retry, nor get the message acknowledged as unmatched. Recorded
// invocations whose app or rule is no longer loaded are returned as
// orphans. A first delivery has no state and costs nothing here.
func (e *Engine) withUnfinished(ctx context.Context, d *delivery, targets []matcher.Target) ([]matcher.Target, []string, error) {
	if d.msg.Deliveries < 2 {
		return targets, nil, nil
	}
	octx, cancel := e.detached(ctx)
	defer cancel()
	fields, err := e.c.State.Unfinished(octx, d.key)
	if err != nil {
		return nil, nil, err
	}
	matched := make(map[string]bool, len(targets))
	for _, t := range targets {
		matched[t.App+"/"+t.Handler] = true
	}
	var orphans []string
	added := false
	for _, f := range fields {
		if matched[f] || f == malformedField {
			continue
		}
		name, handler, _ := strings.Cut(f, "/")
		if i := d.gen.apps.Get(name).RuleIndex(handler); i >= 0 {
			targets = append(targets, matcher.Target{App: name, Handler: handler, Rule: i})
			added = true
			continue
		}
		orphans = append(orphans, f)
	}
	if added {
		// Dispatch order: apps by name, rules by declaration.
		slices.SortStableFunc(targets, func(a, b matcher.Target) int {
			return cmp.Or(strings.Compare(a.App, b.App), cmp.Compare(a.Rule, b.Rule))
		})
	}
	return targets, orphans, nil
}

// unknownTarget is the outcome of a target the Matcher returned that names
// no loaded rule: a Matcher out of step with the apps. The message stays
// pending.
func unknownTarget(t matcher.Target) Outcome {
	return Outcome{Kind: NotRun, App: t.App, Handler: t.Handler, Result: ResultError,
		Err: fmt.Errorf("the matcher returned target %s/%s (rule %d), which no loaded app declares", t.App, t.Handler, t.Rule)}
}
