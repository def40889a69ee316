package stats

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// The reasons a worker holds messages pending
// (docs/delivery.md#held-messages), the values of Hold.Reason and of the
// reason label of relay_apps_unavailable and relay_held_messages.
const (
	// ReasonRulesUnreadable: some of the app's rules could not be read
	// (template or pattern error). Relay cannot tell which events the app
	// would match, so every message of the stream is held.
	ReasonRulesUnreadable = "rules_unreadable"
	// ReasonAppUnavailable: the app's handlers cannot run (a template
	// error outside its patterns, its image or a secret missing, its
	// preparation running); its invocations wait.
	ReasonAppUnavailable = "app_unavailable"
	// ReasonError: handling failed for a reason outside the message (its
	// state or a schedule pin could not be read or written, ...).
	ReasonError = "error"
)

// StatusStaleAfter is the age past which a worker's status is ignored: a
// live worker writes its status every stats interval (a second by
// default), so an older one belongs to a worker that stopped or hangs.
const StatusStaleAfter = 30 * time.Second

// Hold is one reason a worker keeps messages pending.
type Hold struct {
	// App is the app that holds them; "" for a reason of no app.
	App string `json:"app,omitempty"`
	// Reason is one of the Reason constants.
	Reason string `json:"reason"`
	// Error is what is wrong, with the template's file:line:col when the
	// template is at fault.
	Error string `json:"error"`
	// Held counts the messages this hold keeps pending that the worker
	// delivered and saw held; AtLeast says the count reached the bound a
	// worker tracks (MaxHeldTracked) and is a lower bound.
	Held    int  `json:"held"`
	AtLeast bool `json:"at_least,omitempty"`
}

// MaxHeldTracked bounds the message ids a worker remembers per hold, so a
// long stall of a busy stream does not grow its memory without limit.
const MaxHeldTracked = 10_000

// WorkerStatus is what one worker (consumer) publishes about one stream:
// the field of the status hash named by its consumer, as JSON (a wire
// contract: docs/delivery.md#data-layout-in-redis).
type WorkerStatus struct {
	Consumer  string    `json:"consumer"`
	UpdatedAt time.Time `json:"updated_at"`
	Holds     []Hold    `json:"holds"`
	// Running are the handler attempts the worker runs now for the
	// stream, oldest first (docs/delivery.md#worker-status).
	Running []Run `json:"running,omitempty"`
	// Slots are the worker's concurrency slots, which its streams share:
	// every stream's status repeats them. Nil from a worker that does not
	// publish them.
	Slots *Slots `json:"slots,omitempty"`
	// GroupRecreations counts the times the worker created the consumer
	// group again after it had found it (Redis lost its data, or the
	// group or the stream was deleted); GroupRecreatedAt is the last one.
	GroupRecreations int       `json:"group_recreations,omitempty"`
	GroupRecreatedAt time.Time `json:"group_recreated_at,omitzero"`
	// Waiting are the invocations the worker keeps waiting for their
	// rules' flow control, by rule and limit (docs/flow-control.md#waiting).
	Waiting []Waiting `json:"waiting,omitempty"`
}

// Waiting counts the invocations of one rule waiting for one of its
// flow-control limits.
type Waiting struct {
	App     string `json:"app"`
	Handler string `json:"handler"`
	// Limit is "concurrency", "rate" or "debounce".
	Limit string `json:"limit"`
	Count int    `json:"count"`
	// Oldest is the time of the oldest waiting invocation's event, from
	// its stream entry id.
	Oldest time.Time `json:"oldest"`
}

// SumWaiting merges the waiting invocations of workers: one per rule and
// limit, its Count the sum and its Oldest the oldest. Sorted by app,
// handler and limit.
func SumWaiting(workers []WorkerStatus) []Waiting {
	var out []Waiting
	for _, w := range workers {
		for _, v := range w.Waiting {
			i := slices.IndexFunc(out, func(o Waiting) bool { return o.App == v.App && o.Handler == v.Handler && o.Limit == v.Limit })
			if i < 0 {
				out = append(out, v)
				continue
			}
			out[i].Count += v.Count
			if !v.Oldest.IsZero() && (out[i].Oldest.IsZero() || v.Oldest.Before(out[i].Oldest)) {
				out[i].Oldest = v.Oldest
			}
		}
	}
	slices.SortFunc(out, func(a, b Waiting) int {
		return cmp.Or(cmp.Compare(a.App, b.App), cmp.Compare(a.Handler, b.Handler), cmp.Compare(a.Limit, b.Limit))
	})
	return out
}

// Run is one handler attempt a worker runs now.
type Run struct {
	App       string `json:"app"`
	Handler   string `json:"handler"`
	MessageID string `json:"message_id"`
	// Attempt is the attempt's number; MaxAttempts the rule's retries + 1.
	Attempt     int `json:"attempt"`
	MaxAttempts int `json:"max_attempts"`
	// Started is when the handler was started (the worker's clock).
	Started time.Time `json:"started"`
	// TimeoutMS is the rule's timeout in milliseconds, 0 for none.
	TimeoutMS int64 `json:"timeout_ms"`
	// LeaseUntil is when its running lease expires (the Redis clock).
	LeaseUntil time.Time `json:"lease_until"`
	// Lost is set when the worker found the message no longer pending for
	// it while the attempt runs: Redis lost it (a restart without
	// persistence, a flush), it was deleted, or another worker took it
	// over. The attempt still holds its slots.
	Lost bool `json:"lost,omitempty"`
}

// Timeout is r's timeout; 0 for none.
func (r Run) Timeout() time.Duration { return time.Duration(r.TimeoutMS) * time.Millisecond }

// PastTimeout reports whether r has run past its timeout at now: the
// runtime failed to stop a hung handler.
func (r Run) PastTimeout(now time.Time) bool {
	return r.TimeoutMS > 0 && now.Sub(r.Started) > r.Timeout()
}

// Target is "app/handler".
func (r Run) Target() string { return r.App + "/" + r.Handler }

// Slots are a worker's concurrency slots: InUse of Max taken, and per app
// that ran there its slots taken and its bound, min(concurrency, Max).
type Slots struct {
	InUse int        `json:"in_use"`
	Max   int        `json:"max"`
	Apps  []AppSlots `json:"apps,omitempty"`
}

// AppSlots are one app's slots on a worker.
type AppSlots struct {
	App   string `json:"app"`
	InUse int    `json:"in_use"`
	Limit int    `json:"limit"`
}

// Full reports whether every one of the app's slots is taken.
func (a AppSlots) Full() bool { return a.Limit > 0 && a.InUse >= a.Limit }

// App returns the slots of app on s, and false when s has none for it.
func (s *Slots) App(app string) (AppSlots, bool) {
	if s == nil {
		return AppSlots{}, false
	}
	i := slices.IndexFunc(s.Apps, func(a AppSlots) bool { return a.App == app })
	if i < 0 {
		return AppSlots{}, false
	}
	return s.Apps[i], true
}

// Holds merges the holds of workers: one per app and reason, its Held the
// sum (each worker counts the messages it was delivered), its Error the
// first worker's. Sorted by app, then reason.
func Holds(workers []WorkerStatus) []Hold {
	var out []Hold
	for _, w := range workers {
		for _, h := range w.Holds {
			i := slices.IndexFunc(out, func(o Hold) bool { return o.App == h.App && o.Reason == h.Reason })
			if i < 0 {
				out = append(out, h)
				continue
			}
			out[i].Held += h.Held
			out[i].AtLeast = out[i].AtLeast || h.AtLeast
		}
	}
	slices.SortFunc(out, func(a, b Hold) int { return cmp.Or(cmp.Compare(a.App, b.App), cmp.Compare(a.Reason, b.Reason)) })
	return out
}

// String says h in one line: "app orders: rules_unreadable, holds 3
// messages: orders/template.yaml:4:12: ...".
func (h Hold) String() string {
	who := "relay"
	if h.App != "" {
		who = "app " + h.App
	}
	n := fmt.Sprint(h.Held)
	if h.AtLeast {
		n = "at least " + n
	}
	noun := "messages"
	if h.Held == 1 && !h.AtLeast {
		noun = "message"
	}
	return fmt.Sprintf("%s: %s, holds %s %s: %s", who, h.Reason, n, noun, h.Error)
}
