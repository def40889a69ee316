package invocation

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// terminalField is the reserved hash field that marks a retained hash.
const terminalField = "__terminal"

// matchedField is the reserved hash field that says the first delivery
// recorded every invocation of the message (Record.Complete).
const matchedField = "__matched"

// tracePrefix starts the reserved field holding an invocation's trace
// lineage (settle.lua).
const tracePrefix = "__trace:"

// DLQField returns the reserved hash field that holds the id of the
// dead-letter entry of invocation field ("<app>/<handler>"):
// "__dlq:<app>/<handler>", written by Settle with the entry, so a reader of
// the message's state (the console) finds it. It lives as long as the
// hash: with retention 0 only the entry itself outlives the XACK.
func DLQField(field string) string { return dlqPrefix + field }

// dlqPrefix starts the reserved field holding an invocation's dead-letter
// entry id.
const dlqPrefix = "__dlq:"

// TraceField returns the reserved hash field that holds the trace lineage of
// invocation field ("<app>/<handler>"): "__trace:<app>/<handler>". It is
// written by the Retry, Exhaust and Release transitions from Lease.Trace.
// Code that reads the whole hash (Get) must skip every field starting with
// "__": those are not invocations.
func TraceField(field string) string { return tracePrefix + field }

// UnfinishedOf reads Unfinished from the fields of a message's hash, as
// redisstate.Store.Unfinished does; other StateStores call it on their own
// copy.
func UnfinishedOf(m map[string]string) Unfinished {
	if _, ok := m[terminalField]; ok {
		return Unfinished{}
	}
	var u Unfinished
	for f, v := range m {
		if strings.HasPrefix(f, "__") || Final(v) {
			continue
		}
		u.Fields = append(u.Fields, f)
	}
	slices.Sort(u.Fields)
	u.Complete = m[matchedField] == "1"
	return u
}

// SupersededPrefix starts the final value of an invocation a newer event
// with its debounce key superseded: "superseded:<newer message id>"
// (docs/delivery.md#data-layout-in-redis).
const SupersededPrefix = "superseded:"

// Final reports whether v, a stored invocation value, is final: "ok",
// exhausted with its dead-letter entry written (":dlq"), or superseded.
func Final(v string) bool {
	p, err := ParseValue(v)
	return err == nil && (p.State == StateSucceeded || p.State == StateDeadLettered || p.State == StateSuperseded)
}

// State is what a stored invocation value says of its invocation
// (docs/delivery.md#invocation-state).
type State int

const (
	// StateRunning: running:<deadline_ms>:<attempt>:<token>.
	StateRunning State = iota + 1
	// StateWaiting: next_attempt_at:<due_ms>:<attempts used>:<token>.
	StateWaiting
	// StateSucceeded: ok.
	StateSucceeded
	// StateExhausted: exhausted:<attempt>:<token>, its dead-letter entry
	// not written yet.
	StateExhausted
	// StateDeadLettered: exhausted:<attempt>:<token>:dlq.
	StateDeadLettered
	// StateSuperseded: superseded:<newer message id>.
	StateSuperseded
)

var stateNames = [...]string{StateRunning: "running", StateWaiting: "waiting", StateSucceeded: "succeeded",
	StateExhausted: "exhausted", StateDeadLettered: "dead-lettered", StateSuperseded: "superseded"}

func (s State) String() string {
	if s > 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Value is one stored invocation value, parsed.
type Value struct {
	State State
	// Attempt is the attempt running or last failed, or the attempts used
	// of a waiting one; 0 for succeeded and superseded.
	Attempt int
	// Until is a running attempt's lease end or a waiting one's due time
	// (the Redis server's clock); zero otherwise.
	Until time.Time
	// Token is the claim token of running, waiting and exhausted values.
	Token string
	// SupersededBy is the newer message of a superseded one.
	SupersededBy string
}

// ParseValue parses v, a value of an invocation field
// ("running:<deadline_ms>:<attempt>:<token>", "ok", ...). The error says
// what does not parse.
func ParseValue(v string) (Value, error) {
	if v == "ok" {
		return Value{State: StateSucceeded}, nil
	}
	if by, ok := strings.CutPrefix(v, SupersededPrefix); ok && by != "" {
		return Value{State: StateSuperseded, SupersededBy: by}, nil
	}
	parts := strings.Split(v, ":")
	num := func(i int) (int64, bool) {
		n, err := strconv.ParseInt(parts[i], 10, 64)
		return n, err == nil && n >= 0
	}
	switch {
	case (parts[0] == "running" || parts[0] == "next_attempt_at") && len(parts) == 4 && parts[3] != "":
		ms, ok1 := num(1)
		a, ok2 := num(2)
		if ok1 && ok2 {
			st := StateRunning
			if parts[0] == "next_attempt_at" {
				st = StateWaiting
			}
			return Value{State: st, Attempt: int(a), Until: time.UnixMilli(ms), Token: parts[3]}, nil
		}
	case parts[0] == "exhausted" && (len(parts) == 3 || len(parts) == 4 && parts[3] == "dlq") && parts[2] != "":
		if a, ok := num(1); ok {
			st := StateExhausted
			if len(parts) == 4 {
				st = StateDeadLettered
			}
			return Value{State: st, Attempt: int(a), Token: parts[2]}, nil
		}
	}
	return Value{}, fmt.Errorf("invocation value %q: want running:<ms>:<attempt>:<token>, next_attempt_at:<ms>:<attempts>:<token>, ok, exhausted:<attempt>:<token>[:dlq] or superseded:<message id>", v)
}
