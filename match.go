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
	"github.com/relaydev/relay/schedule"
)

// entryKind is what a stream entry is.
type entryKind int

const (
	// entryEvent: an external event, to be matched against the apps' rules.
	// Whether its "event" field holds a JSON object is the Matcher's to say.
	entryEvent entryKind = iota
	// entryOccurrence: one of Relay's own schedule occurrences, dispatched
	// straight to its schedule's handler (docs/schedules.md#the-stream-entry).
	entryOccurrence
	// entryMalformed: an entry that can never succeed; it is dead-lettered
	// once, without running a handler.
	entryMalformed
	// entryOversized: an event larger than Config.MaxEventBytes; it is
	// dead-lettered once, undecoded, with a summary in place of its payload.
	entryOversized
)

// entry is the decode stage's value: what the entry is, and for one that
// can never succeed, why.
type entry struct {
	kind   entryKind
	reason string
}

// decode is the first stage (docs/delivery.md#from-entry-to-acknowledgement):
// it looks at the entry alone, before anything is read from Redis. An
// event larger than the limit is not looked into at all: its payload goes
// nowhere, not into the DLQ entry, a log line or a span, and d.event
// becomes its summary.
func (p *pipeline) decode(ctx context.Context, d *delivery) entry {
	raw, ok := d.msg.Fields["event"]
	limit := p.cfg.MaxEventBytes
	var e entry
	switch {
	case !ok:
		e = entry{kind: entryMalformed, reason: "message has no event field"}
	case limit > 0 && len(raw) > limit:
		e = entry{kind: entryOversized, reason: fmt.Sprintf("event is %d bytes, larger than the limit of %d (MAX_EVENT_BYTES)", len(raw), limit)}
		d.event = oversizedSummary(raw, limit)
	case mayBeEnvelope(raw) && schedule.IsEnvelope([]byte(raw)):
		return entry{kind: entryOccurrence}
	}
	p.obs.message(ctx, d, msgEvent{kind: msgReceived})
	if e.kind == entryOversized {
		p.obs.message(ctx, d, msgEvent{kind: msgOversized, reason: e.reason})
	}
	return e
}

// mayBeEnvelope is the test schedule.IsEnvelope starts with, on the string:
// an event without the source literal or an escape sequence that could
// spell it is no envelope, and is not copied to find that out.
func mayBeEnvelope(raw string) bool {
	return strings.Contains(raw, schedule.Source) || strings.IndexByte(raw, '\\') >= 0
}

// summaryPrefix is how much of an oversized event its summary shows.
const summaryPrefix = 200

// oversizedSummary is what a DLQ entry holds in place of an oversized
// event: its size, the limit, and its first bytes as text, so an operator
// can tell which event it was without the payload being copied again.
func oversizedSummary(raw string, limit int) string {
	head := raw[:min(len(raw), summaryPrefix)]
	return fmt.Sprintf("(oversized event: %d bytes, over the limit of %d; the entry stays in the stream until retention removes it; it begins: %s…)",
		len(raw), limit, strings.ToValidUTF8(head, "\ufffd"))
}

// malformedField is the invocation field of a message that is
// dead-lettered whole (malformed, oversized, an invalid occurrence); it
// gives that path the same idempotent DLQ marker as handler invocations.
var malformedField = invocation.Field(dlq.MalformedName, dlq.MalformedName)

// plan is the match stage's value: what the message asks of the invoke
// stage.
type plan struct {
	// calls are the invocations to drive, in dispatch order.
	calls []call
	// orphans are unfinished invocations whose app or rule is no longer
	// loaded.
	orphans []string
	// unknown lists targets the Matcher returned that name no loaded rule.
	unknown []matcher.Target
	// deadLetter, when set, says why the message itself can never succeed:
	// it is dead-lettered whole, without running a handler.
	deadLetter string
	// pending keeps the message pending for a reason outside its
	// invocations (matching failed, the occurrence's app is unavailable).
	pending *pendingReason
	// ack acknowledges the message without driving anything: it matched
	// nothing, or is an obsolete occurrence (hasState then says an earlier
	// delivery may have left state to retain).
	ack bool
	// needsAllRules is set for an external event, matched or not: its
	// acknowledgement also needs every app's rules to be known.
	needsAllRules bool
	// hasState is set when the message may have invocation state, to be
	// retained once it is acknowledged.
	hasState bool
}

// match is the second stage of an external event's delivery: every rule the
// event matches, apps in name order and rules in declaration order
// (docs/delivery.md#from-entry-to-acknowledgement). A redelivery drives
// what the first delivery recorded: exactly the recorded invocations still
// unfinished when the record is complete, without matching again;
// otherwise the rules the event matches now plus the unfinished ones.
func (p *pipeline) match(ctx context.Context, d *delivery, e entry) plan {
	switch e.kind {
	case entryOccurrence:
		return p.occurrence(ctx, d)
	case entryMalformed:
		p.obs.message(ctx, d, msgEvent{kind: msgMalformed, reason: e.reason})
		return plan{deadLetter: e.reason, hasState: true}
	case entryOversized:
		return plan{deadLetter: e.reason, hasState: true}
	}
	var unfinished invocation.Unfinished
	if d.msg.Deliveries >= 2 {
		var err error
		unblock := p.act.block()
		unfinished, err = p.state.Unfinished(p.writeCtx(ctx), d.key)
		unblock()
		if err != nil {
			return plan{pending: &pendingReason{level: slog.LevelError, msg: "reading the message's unfinished invocations failed; message left pending", err: err}}
		}
	}
	var targets []matcher.Target
	event := []byte(d.event) // one copy, for the matcher and every handler's stdin
	if !unfinished.Complete {
		var err error
		targets, err = d.gen.matcher.Match(event)
		if errors.Is(err, matcher.ErrMalformed) {
			// The reason is read by operators in relay dlq ls; drop the
			// package prefix.
			reason := strings.TrimPrefix(err.Error(), "matcher: ")
			p.obs.message(ctx, d, msgEvent{kind: msgMalformed, reason: reason})
			return plan{deadLetter: reason, hasState: true}
		}
		if err != nil {
			// Not the message's fault: leave it pending for a later delivery.
			return plan{pending: &pendingReason{level: slog.LevelError, msg: "match failed; message left pending", err: err}}
		}
	}
	targets, orphans := withUnfinished(d, targets, unfinished.Fields)
	pl := plan{orphans: orphans, needsAllRules: true, hasState: true}
	for _, t := range targets {
		a := d.gen.apps.Get(t.App)
		if a == nil || t.Rule < 0 || t.Rule >= len(a.Rules) {
			pl.unknown = append(pl.unknown, t)
			continue
		}
		r := a.Rules[t.Rule]
		input := event
		if len(pl.calls) > 0 {
			input = slices.Clone(event) // a handler's stdin is its own
		}
		c := call{app: a.Name, handler: r.Handler, timeout: r.Timeout, retries: r.Retries, input: input,
			field: d.gen.field(a.Name, t.Rule), limits: r.Limits}
		if !r.Limits.IsZero() {
			c.gate = gateOf(r.Limits, event)
		}
		pl.calls = append(pl.calls, c)
	}
	if !unfinished.Complete && len(pl.calls) == 0 && len(pl.orphans) == 0 && len(pl.unknown) == 0 {
		// Matched nothing: acknowledged, never retried. A first delivery
		// left no state to retain.
		p.obs.message(ctx, d, msgEvent{kind: msgUnmatched})
		return plan{ack: true, needsAllRules: true, hasState: d.msg.Deliveries >= 2}
	}
	p.obs.message(ctx, d, msgEvent{kind: msgMatched})
	if d.msg.Deliveries < 2 {
		// The first claim records every invocation, so a redelivery runs
		// exactly these.
		d.record = make([]string, len(pl.calls))
		for i, c := range pl.calls {
			d.record[i] = c.field
		}
		d.complete = len(d.gen.incomplete) == 0 && len(pl.unknown) == 0
	}
	return pl
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
		matched[invocation.Field(t.App, t.Handler)] = true
	}
	var orphans []string
	added := false
	for _, f := range unfinished {
		if matched[f] || f == malformedField {
			continue
		}
		name, handler := invocation.SplitField(f)
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
