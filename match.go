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
	"github.com/relaydev/relay/invocation"
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
	// recorded is set when the plan is what the first delivery recorded
	// (invocation.Record.Complete): a redelivery with nothing left is then
	// a matched message whose invocations are all done, not an unmatched
	// one.
	recorded bool
}

// unmatched reports that the event matched nothing.
func (p plan) unmatched() bool {
	return !p.recorded && len(p.calls) == 0 && len(p.orphans) == 0 && len(p.unknown) == 0
}

// fields are the invocation fields of the plan's calls, in dispatch order.
func (p plan) fields() []string {
	out := make([]string, len(p.calls))
	for i, c := range p.calls {
		out[i] = c.field()
	}
	return out
}

// match is the second stage of an external event's delivery: every rule the
// event matches, apps in name order and rules in declaration order
// (docs/delivery.md#from-entry-to-acknowledgement). A redelivery drives
// what the first delivery recorded: exactly the recorded invocations still
// unfinished when the record is complete, without matching again;
// otherwise the rules the event matches now plus the unfinished ones. An
// event that is not a JSON object gets a plan with only malformed set; a
// pendingReason says the message must stay pending because classifying it failed.
func (e *Engine) match(ctx context.Context, d *delivery) (plan, *pendingReason) {
	var unfinished invocation.Unfinished
	if d.msg.Deliveries >= 2 {
		u, err := e.c.State.Unfinished(e.writeCtx(ctx), d.key)
		if err != nil {
			return plan{}, &pendingReason{level: slog.LevelError, msg: "reading the message's unfinished invocations failed; message left pending", err: err}
		}
		unfinished = u
	}
	var targets []matcher.Target
	if !unfinished.Complete {
		var err error
		targets, err = d.gen.matcher.Match([]byte(d.event))
		if errors.Is(err, matcher.ErrMalformed) {
			// The reason is read by operators in relay dlq ls; drop the
			// package prefix.
			return plan{malformed: strings.TrimPrefix(err.Error(), "matcher: ")}, nil
		}
		if err != nil {
			// Not the message's fault: leave it pending for a later delivery.
			return plan{}, &pendingReason{level: slog.LevelError, msg: "match failed; message left pending", err: err}
		}
	}
	targets, orphans := withUnfinished(d, targets, unfinished.Fields)
	p := plan{orphans: orphans, recorded: unfinished.Complete}
	for _, t := range targets {
		a := d.gen.apps.Get(t.App)
		if a == nil || t.Rule < 0 || t.Rule >= len(a.Rules) {
			p.unknown = append(p.unknown, t)
			continue
		}
		r := a.Rules[t.Rule]
		p.calls = append(p.calls, call{app: a.Name, handler: r.Handler, timeout: r.Timeout, retries: r.Retries, input: []byte(d.event),
			invField: d.gen.field(a.Name, t.Rule)})
	}
	return p, nil
}

// withUnfinished adds to targets the unfinished invocations of a
// redelivered message that this match did not return. The event was
// classified at its first delivery: a now() cutoff that passed since, or a
// changed template, must not drop an invocation that waits for its retry,
// nor get the message acknowledged as unmatched. Unfinished invocations
// whose app or rule is no longer loaded are returned as orphans.
func withUnfinished(d *delivery, targets []matcher.Target, unfinished []string) ([]matcher.Target, []string) {
	if len(unfinished) == 0 {
		return targets, nil
	}
	matched := make(map[string]bool, len(targets))
	for _, t := range targets {
		matched[t.App+"/"+t.Handler] = true
	}
	var orphans []string
	added := false
	for _, f := range unfinished {
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
	return targets, orphans
}

// unknownTarget is the outcome of a target the Matcher returned that names
// no loaded rule: a Matcher out of step with the apps. The message stays
// pending.
func unknownTarget(t matcher.Target) Outcome {
	return Outcome{Kind: NotRun, App: t.App, Handler: t.Handler, Result: ResultError,
		Err: fmt.Errorf("the matcher returned target %s/%s (rule %d), which no loaded app declares", t.App, t.Handler, t.Rule)}
}
