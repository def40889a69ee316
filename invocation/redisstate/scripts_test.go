package redisstate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/invocation"
)

// TTL expectations of checkPTTL.
const (
	ttlNone  time.Duration = -1 // the key has no TTL (pending)
	ttlNoKey time.Duration = -2 // the key does not exist
	ttlHour                = time.Hour
)

const hourMS = int64(time.Hour / time.Millisecond)

func running(deadlineMS int64, attempt int, token string) string {
	return fmt.Sprintf("running:%d:%d:%s", deadlineMS, attempt, token)
}

func nextAt(deadlineMS int64, attempt int, token string) string {
	return fmt.Sprintf("next_attempt_at:%d:%d:%s", deadlineMS, attempt, token)
}

func exhausted(attempt int, token string) string {
	return fmt.Sprintf("exhausted:%d:%s", attempt, token)
}

func dead(attempt int, token string) string { return exhausted(attempt, token) + ":dlq" }

// at is what a row's expectations may depend on: the env's key, the server
// time before seeding (seed), the server time the script ran (now) and the
// ids of the entries of the stream's dead-letter stream after the call.
type at struct {
	key       invocation.Key
	seed, now int64
	dlq       []string
}

// dlqID is the id of the i-th dead-letter entry after the call, "" when
// there are fewer.
func (a at) dlqID(i int) string {
	if i < len(a.dlq) {
		return a.dlq[i]
	}
	return ""
}

// scriptCase is one row of a script's table test. Times are the server's
// TIME in Unix ms. The script's now is not known exactly: the runner tries
// every ms between two TIME reads around the call.
type scriptCase struct {
	name string
	// seed returns the fields to HSET, given the server time; nil leaves
	// the key missing.
	seed func(now int64) map[string]string
	// seedTTL, when > 0, PEXPIREs the seeded hash.
	seedTTL time.Duration
	// message is the state of the key's message when the call runs
	// (messageIn): "" leaves it pending, as a delivery finds it.
	message string
	// call runs the Store method; the env's claims get the token "new".
	call func(ctx context.Context, e *env) (any, error)
	// wantErr is matched with errors.Is; nil means the call succeeds
	// unless wantSomeErr asks for an error without a sentinel.
	wantErr     error
	wantSomeErr bool
	// want is the expected result; nil skips the comparison.
	want func(a at) any
	// state is the expected HGETALL; nil means the seed, unchanged.
	state func(a at) map[string]string
	// pttl is the expected PTTL (ttlNone, ttlNoKey, or an upper bound).
	pttl time.Duration
	// dlq are the entries expected in the stream's dead-letter stream
	// after the call, IDs aside, in order; nil means none.
	dlq func(a at) []dlq.Entry
	// acked says the call acknowledges the key's message. Otherwise a
	// message left pending (message "") is still pending after it; the
	// env's other message always is.
	acked bool
}

func runScriptCases(t *testing.T, cases []scriptCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, "new")
			a := at{key: e.key, seed: e.nowMS(t)}
			seeded := map[string]string{}
			if tc.seed != nil {
				seeded = tc.seed(a.seed)
				e.seed(t, seeded, tc.seedTTL)
			}
			if err := messageIn(t.Context(), e, tc.message); err != nil {
				t.Fatalf("message %s: %v", tc.message, err)
			}
			before := e.nowMS(t)
			got, err := tc.call(t.Context(), e)
			after := e.nowMS(t)
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("error = %v, want %v", err, tc.wantErr)
				}
			case tc.wantSomeErr:
				if err == nil {
					t.Fatalf("error = nil, want one")
				}
				if errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal) {
					t.Fatalf("error = %v, want one that is neither ErrStale nor ErrTerminal", err)
				}
			case err != nil:
				t.Fatalf("error = %v, want nil", err)
			}
			hash, pttl := e.state(t)
			checkPTTL(t, tc.pttl, pttl)
			if tc.message == "" {
				if got, want := pending(t, e.c, e.key) == 1, !tc.acked; got != want {
					t.Errorf("message pending = %v after the call, want %v", got, want)
				}
			}
			if tc.message == "" || tc.message == "acked" {
				if pending(t, e.c, e.other) != 1 {
					t.Errorf("the call acknowledged another message")
				}
			}
			var entries []dlq.Entry
			a.dlq, entries = withoutIDs(dlqEntries(t, e.c, e.key.Stream))

			var diff string
			for a.now = before; a.now <= after; a.now++ {
				diff = ""
				if tc.want != nil {
					diff += cmp.Diff(tc.want(a), got, cmpopts.EquateEmpty())
				}
				wantState := seeded
				if tc.state != nil {
					wantState = tc.state(a)
				}
				diff += cmp.Diff(wantState, hash)
				var wantDLQ []dlq.Entry
				if tc.dlq != nil {
					wantDLQ = tc.dlq(a)
				}
				diff += cmp.Diff(wantDLQ, entries, cmpopts.EquateEmpty())
				if diff == "" {
					return
				}
			}
			t.Errorf("result, HGETALL or dead-letter entries mismatch (-want +got), script time in %d..%d:\n%s", before, after, diff)
		})
	}
}

// field returns a seed or state of testField alone.
func field(v func(now int64) string) func(now int64) map[string]string {
	return func(now int64) map[string]string { return map[string]string{testField: v(now)} }
}

// fieldAt is field for a state, which depends on the script's time.
func fieldAt(v func(a at) string) func(a at) map[string]string {
	return func(a at) map[string]string { return map[string]string{testField: v(a)} }
}

// transition is a fenced write under test, given a lease of testField.
type transition func(ctx context.Context, s *Store, l invocation.Lease) (any, error)

// settleAs is the transition that applies the settlement of(l) and returns
// its transitions' results.
func settleAs(of func(l invocation.Lease) invocation.Settlement) transition {
	return func(ctx context.Context, s *Store, l invocation.Lease) (any, error) {
		r := settleOne(ctx, s, of(l))
		return r.Transitions, r.Err
	}
}

// settleOf is settleAs of one transition of kind (one).
func settleOf(kind invocation.TransitionKind) transition {
	return settleAs(func(l invocation.Lease) invocation.Settlement { return one(kind, l) })
}

// retryIn is settleAs of one Retry with backoff.
func retryIn(backoff time.Duration) transition {
	return settleAs(func(l invocation.Lease) invocation.Settlement {
		st := one(invocation.Retry, l)
		st.Transitions[0].Backoff = backoff
		return st
	})
}

// results is the result of an applied settlement, one TransitionResult
// per transition.
func results(rs ...invocation.TransitionResult) func(a at) any {
	return func(at) any { return rs }
}

// entries returns the dlq expectation of one entry per lease (stored),
// leases of testField of the row's key.
func entries(leases ...func(key invocation.Key) invocation.Lease) func(a at) []dlq.Entry {
	return func(a at) []dlq.Entry {
		var out []dlq.Entry
		for _, l := range leases {
			out = append(out, stored(l(a.key)))
		}
		return out
	}
}

// leaseOf returns the lease of testField at attempt, token and trace.
func leaseOf(attempt int, token, trace string) func(key invocation.Key) invocation.Lease {
	return func(key invocation.Key) invocation.Lease {
		return invocation.Lease{Key: key, Field: testField, Attempt: attempt, Token: token, Trace: trace}
	}
}

// callWith runs do with the lease of testField at attempt and token.
func callWith(do transition, attempt int, token string) func(ctx context.Context, e *env) (any, error) {
	return func(ctx context.Context, e *env) (any, error) { return do(ctx, e.s, e.lease(attempt, token)) }
}

// fencedRejects are the rows every fenced transition shares. do is called
// with attempt 2 and token "tok"; accepted(now, attempt, token) is the kind
// of value do accepts; wrong lists values of other kinds with the same
// attempt and token. No row writes a dead-letter entry or acknowledges the
// message.
func fencedRejects(do transition, accepted func(now int64, attempt int, token string) string, wrong ...func(now int64) string) []scriptCase {
	call := callWith(do, 2, "tok")
	cases := []scriptCase{
		{
			name: "stale token", wantErr: invocation.ErrStale, pttl: ttlNone, call: call,
			seed: field(func(now int64) string { return accepted(now, 2, "other") }),
		},
		{
			name: "older attempt", wantErr: invocation.ErrStale, pttl: ttlNone, call: call,
			seed: field(func(now int64) string { return accepted(now, 3, "tok") }),
		},
		{
			name: "newer attempt", wantErr: invocation.ErrStale, pttl: ttlNone, call: call,
			seed: field(func(now int64) string { return accepted(now, 1, "tok") }),
		},
		{
			name: "terminal", wantErr: invocation.ErrTerminal, pttl: ttlHour, seedTTL: ttlHour, call: call,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: accepted(now, 2, "tok"), terminalField: "1"}
			},
		},
		{
			name: "terminal without field", wantErr: invocation.ErrTerminal, pttl: ttlHour, seedTTL: ttlHour, call: call,
			seed: func(int64) map[string]string { return map[string]string{terminalField: "1"} },
		},
		{name: "missing key", wantErr: invocation.ErrStale, pttl: ttlNoKey, call: call},
		{
			name: "acknowledged", wantErr: invocation.ErrTerminal, pttl: ttlNone, call: call, message: "acked",
			seed: field(func(now int64) string { return accepted(now, 2, "tok") }),
		},
		{name: "acknowledged without state", wantErr: invocation.ErrTerminal, pttl: ttlNoKey, call: call, message: "acked"},
		{
			name: "group gone", wantErr: invocation.ErrTerminal, pttl: ttlNone, call: call, message: "no group",
			seed: field(func(now int64) string { return accepted(now, 2, "tok") }),
		},
		{
			name: "stream gone", wantErr: invocation.ErrTerminal, pttl: ttlNone, call: call, message: "no stream",
			seed: field(func(now int64) string { return accepted(now, 2, "tok") }),
		},
		{
			name: "missing field", wantErr: invocation.ErrStale, pttl: ttlNone, call: call,
			seed: func(int64) map[string]string { return map[string]string{"other/handler": "ok"} },
		},
		{
			name: "ok", wantErr: invocation.ErrStale, pttl: ttlNone, call: call,
			seed: field(func(int64) string { return "ok" }),
		},
		{
			name: "next_attempt_at", wantErr: invocation.ErrStale, pttl: ttlNone, call: call,
			seed: field(func(now int64) string { return nextAt(now+hourMS, 2, "tok") }),
		},
		{
			name: "malformed", wantErr: invocation.ErrStale, pttl: ttlNone, call: call,
			seed: field(func(int64) string { return "garbage" }),
		},
	}
	for _, w := range wrong {
		v := w(0)
		name := strings.SplitN(v, ":", 2)[0]
		if strings.HasSuffix(v, ":dlq") {
			name += " dlq"
		}
		cases = append(cases, scriptCase{
			name: "other kind " + name, wantErr: invocation.ErrStale, pttl: ttlNone, call: call, seed: field(w),
		})
	}
	return cases
}

// runningLive is a running value with a deadline an hour ahead.
func runningLive(now int64, attempt int, token string) string {
	return running(now+hourMS, attempt, token)
}

func exhaustedValue(_ int64, attempt int, token string) string { return exhausted(attempt, token) }

func exhaustedSame(int64) string { return exhausted(2, "tok") }
func deadSame(int64) string      { return dead(2, "tok") }
func runningSame(now int64) string {
	return runningLive(now, 2, "tok")
}

// Trace lineages as the Engine stores them (W3C traceparents), and the
// reserved field that holds testField's.
const (
	tp1 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	tp2 = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
)

var traceKey = invocation.TraceField(testField)

// callTraced is callWith on a lease whose Trace is trace.
func callTraced(do transition, attempt int, token, trace string) func(ctx context.Context, e *env) (any, error) {
	return func(ctx context.Context, e *env) (any, error) {
		l := e.lease(attempt, token)
		l.Trace = trace
		return do(ctx, e.s, l)
	}
}

// withPrev sets PrevTrace on the Claim want returns.
func withPrev(want func(a at) any, trace string) func(a at) any {
	return func(a at) any {
		c := want(a).(invocation.Claim)
		c.PrevTrace = trace
		return c
	}
}

// traceRejects are the rows of a transition that stores Lease.Trace: a
// rejected transition leaves the stored trace alone.
func traceRejects(do transition, accepted func(now int64, attempt int, token string) string) []scriptCase {
	return []scriptCase{
		{
			name: "stale token keeps the stored trace", wantErr: invocation.ErrStale, pttl: ttlNone,
			call: callTraced(do, 2, "tok", tp2),
			seed: func(now int64) map[string]string {
				return map[string]string{testField: accepted(now, 2, "other"), traceKey: tp1}
			},
		},
		{
			name: "terminal keeps the stored trace", wantErr: invocation.ErrTerminal, pttl: ttlHour, seedTTL: ttlHour,
			call: callTraced(do, 2, "tok", tp2),
			seed: func(now int64) map[string]string {
				return map[string]string{testField: accepted(now, 2, "tok"), terminalField: "1", traceKey: tp1}
			},
		},
	}
}

// claimCall runs the claim r(e) as a batch of one.
func claimCall(r func(e *env) invocation.ClaimRequest) func(ctx context.Context, e *env) (any, error) {
	return func(ctx context.Context, e *env) (any, error) { return claimOne(ctx, e.s, r(e)) }
}

func TestClaimScript(t *testing.T) {
	const lease = 30 * time.Second
	leaseMS := lease.Milliseconds()
	claim := func(maxAttempts int) func(ctx context.Context, e *env) (any, error) {
		return claimCall(func(e *env) invocation.ClaimRequest { return e.req(lease, maxAttempts) })
	}
	claimed := func(attempt int) func(a at) any {
		return func(a at) any {
			return invocation.Claim{Status: invocation.Claimed, Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: attempt,
				Token: "new", Deadline: time.UnixMilli(a.now + leaseMS)}}
		}
	}
	runningNew := func(attempt int) func(a at) map[string]string {
		return fieldAt(func(a at) string { return running(a.now+leaseMS, attempt, "new") })
	}
	found := func(st invocation.Status, attempt int, token string) func(a at) any {
		return func(a at) any {
			return invocation.Claim{Status: st, Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: attempt, Token: token}}
		}
	}
	fixed := func(c invocation.Claim) func(at) any { return func(at) any { return c } }
	lost := func(attempt int, want func(a at) any) func(a at) any {
		return func(a at) any {
			c := want(a).(invocation.Claim)
			c.Lost = attempt
			return c
		}
	}

	cases := []scriptCase{
		{
			name: "missing key", call: claim(5), pttl: ttlNone,
			want: claimed(1), state: runningNew(1),
		},
		{
			name: "fresh key", call: claim(5), pttl: ttlNone,
			seed: func(int64) map[string]string { return map[string]string{"other/handler": "ok"} },
			want: claimed(1),
			state: func(a at) map[string]string {
				return map[string]string{"other/handler": "ok", testField: running(a.now+leaseMS, 1, "new")}
			},
		},
		{
			name: "running live", call: claim(5), pttl: ttlNone,
			seed: field(func(now int64) string { return running(now+hourMS, 2, "old") }),
			want: func(a at) any {
				return invocation.Claim{Status: invocation.Running, RunningUntil: time.UnixMilli(a.seed + hourMS), Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: 2}}
			},
		},
		{
			name: "running live at max attempts", call: claim(2), pttl: ttlNone,
			seed: field(func(now int64) string { return running(now+hourMS, 2, "old") }),
			want: func(a at) any {
				return invocation.Claim{Status: invocation.Running, RunningUntil: time.UnixMilli(a.seed + hourMS), Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: 2}}
			},
		},
		{
			name: "running expired", call: claim(5), pttl: ttlNone,
			seed: field(func(now int64) string { return running(now-1000, 2, "old") }),
			want: lost(2, claimed(3)), state: runningNew(3),
		},
		{
			name: "running expired at max attempts", call: claim(5), pttl: ttlNone,
			seed:  field(func(now int64) string { return running(now-1000, 5, "old") }),
			want:  lost(5, found(invocation.Exhausted, 5, "new")),
			state: fieldAt(func(at) string { return exhausted(5, "new") }),
		},
		{
			name: "running expired beyond max attempts", call: claim(3), pttl: ttlNone,
			seed:  field(func(now int64) string { return running(now-1000, 4, "old") }),
			want:  lost(4, found(invocation.Exhausted, 4, "new")),
			state: fieldAt(func(at) string { return exhausted(4, "new") }),
		},
		{
			name: "next_attempt_at future", call: claim(5), pttl: ttlNone,
			seed: field(func(now int64) string { return nextAt(now+hourMS, 2, "old") }),
			want: func(a at) any {
				return invocation.Claim{Status: invocation.NotDue, NextAttemptAt: time.UnixMilli(a.seed + hourMS), Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: 2}}
			},
		},
		{
			name: "next_attempt_at due", call: claim(5), pttl: ttlNone,
			seed: field(func(now int64) string { return nextAt(now-1000, 2, "old") }),
			want: claimed(3), state: runningNew(3),
		},
		{
			name: "next_attempt_at due at max attempts", call: claim(4), pttl: ttlNone,
			seed:  field(func(now int64) string { return nextAt(now-1000, 4, "old") }),
			want:  found(invocation.Exhausted, 4, "new"),
			state: fieldAt(func(at) string { return exhausted(4, "new") }),
		},
		{
			name: "released attempt due", call: claim(2), pttl: ttlNone,
			seed: field(func(now int64) string { return nextAt(now, 1, "old") }),
			want: claimed(2), state: runningNew(2),
		},
		{
			name: "ok", call: claim(5), pttl: ttlNone,
			seed: field(func(int64) string { return "ok" }),
			want: fixed(invocation.Claim{Status: invocation.Succeeded}),
		},
		{
			name: "exhausted", call: claim(5), pttl: ttlNone,
			seed: field(func(int64) string { return exhausted(3, "old") }),
			want: found(invocation.Exhausted, 3, "old"),
		},
		{
			name: "dead-lettered", call: claim(5), pttl: ttlNone,
			seed: field(func(int64) string { return dead(3, "old") }),
			want: found(invocation.DeadLettered, 3, "old"),
		},
		{
			name: "terminal", call: claim(5), pttl: ttlHour, seedTTL: ttlHour,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: running(now-1000, 1, "old"), terminalField: "1"}
			},
			want: fixed(invocation.Claim{Status: invocation.Terminal}),
		},
		{
			name: "terminal without field", call: claim(5), pttl: ttlHour, seedTTL: ttlHour,
			seed: func(int64) map[string]string { return map[string]string{terminalField: "1"} },
			want: fixed(invocation.Claim{Status: invocation.Terminal}),
		},
		// A delivery that outlived its message's acknowledgement: nothing
		// runs and nothing is written, with or without state.
		{
			name: "acknowledged without state", call: claim(5), pttl: ttlNoKey, message: "acked",
			want: fixed(invocation.Claim{Status: invocation.Terminal, NotPending: true}),
		},
		{
			name: "acknowledged with an expired lease", call: claim(5), pttl: ttlNone, message: "acked",
			seed: field(func(now int64) string { return running(now-1000, 1, "old") }),
			want: fixed(invocation.Claim{Status: invocation.Terminal, NotPending: true}),
		},
		{
			name: "acknowledged with a due retry", call: claim(5), pttl: ttlNone, message: "acked",
			seed: field(func(now int64) string { return nextAt(now-1000, 4, "old") }),
			want: fixed(invocation.Claim{Status: invocation.Terminal, NotPending: true}),
		},
		{
			name: "group gone", call: claim(5), pttl: ttlNoKey, message: "no group",
			want: fixed(invocation.Claim{Status: invocation.Terminal, NotPending: true}),
		},
		{
			name: "stream gone", call: claim(5), pttl: ttlNoKey, message: "no stream",
			want: fixed(invocation.Claim{Status: invocation.Terminal, NotPending: true}),
		},
		{
			name: "retry due returns the stored trace", call: claim(5), pttl: ttlNone,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: nextAt(now-1000, 2, "old"), traceKey: tp1}
			},
			want: withPrev(claimed(3), tp1),
			state: func(a at) map[string]string {
				return map[string]string{testField: running(a.now+leaseMS, 3, "new"), traceKey: tp1}
			},
		},
		{
			name: "another field's trace is not returned", call: claim(5), pttl: ttlNone,
			seed: func(int64) map[string]string { return map[string]string{invocation.TraceField("other/handler"): tp1} },
			want: claimed(1),
			state: func(a at) map[string]string {
				return map[string]string{testField: running(a.now+leaseMS, 1, "new"), invocation.TraceField("other/handler"): tp1}
			},
		},
		{
			name: "expired lease at max attempts returns the stored trace", call: claim(2), pttl: ttlNone,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: running(now-1000, 2, "old"), traceKey: tp1}
			},
			want: lost(2, withPrev(found(invocation.Exhausted, 2, "new"), tp1)),
			state: func(at) map[string]string {
				return map[string]string{testField: exhausted(2, "new"), traceKey: tp1}
			},
		},
		{
			name: "exhausted returns the stored trace", call: claim(5), pttl: ttlNone,
			seed: func(int64) map[string]string { return map[string]string{testField: exhausted(3, "old"), traceKey: tp2} },
			want: withPrev(found(invocation.Exhausted, 3, "old"), tp2),
		},
		{
			name: "dead-lettered returns the stored trace", call: claim(5), pttl: ttlNone,
			seed: func(int64) map[string]string { return map[string]string{testField: dead(3, "old"), traceKey: tp2} },
			want: withPrev(found(invocation.DeadLettered, 3, "old"), tp2),
		},
	}
	for _, v := range []string{"garbage", "ok:", "running:x:1:tok", "running:1:1:", "running:1:1:a:b",
		"next_attempt_at:1:1", "exhausted:1", "exhausted:1:tok:xyz", "exhausted:x:tok:dlq"} {
		cases = append(cases, scriptCase{
			name: "malformed " + v, call: claim(5), pttl: ttlNone, wantSomeErr: true,
			seed: field(func(int64) string { return v }),
		})
	}
	runScriptCases(t, cases)
}

// TestClaimScriptRecords covers the recording of a message's other
// invocations (Record) on every kind of claim: a recorded field with state
// keeps it, one without becomes next_attempt_at:<now>:0:<token>, and a
// complete record sets __matched; a retained hash gets nothing. The large
// record spans several of claim_one's reads and writes (prelude.lua).
func TestClaimScriptRecords(t *testing.T) {
	const lease = 30 * time.Second
	leaseMS := lease.Milliseconds()
	claim := func(maxAttempts int, rec invocation.Record) func(ctx context.Context, e *env) (any, error) {
		return claimCall(func(e *env) invocation.ClaimRequest {
			r := e.req(lease, maxAttempts)
			r.Record = rec
			return r
		})
	}
	claimed := func(a at) any {
		return invocation.Claim{Status: invocation.Claimed, Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: 1,
			Token: "new", Deadline: time.UnixMilli(a.now + leaseMS)}}
	}
	// with returns m plus the fields of rec recorded at now, unless m has
	// them, and __matched when rec is complete.
	with := func(m map[string]string, now int64, rec invocation.Record) map[string]string {
		out := map[string]string{}
		for f, v := range m {
			out[f] = v
		}
		for _, f := range rec.Fields {
			if _, ok := out[f]; !ok {
				out[f] = nextAt(now, 0, "new")
			}
		}
		if rec.Complete {
			out[matchedField] = "1"
		}
		return out
	}
	two := invocation.Record{Fields: []string{"b/one", "b/two"}, Complete: true}
	var large invocation.Record
	largeSeed := map[string]string{}
	for i := range 2500 {
		f := fmt.Sprintf("b/h%d", i)
		large.Fields = append(large.Fields, f)
		if i%3 == 0 {
			largeSeed[f] = "ok"
		}
	}
	large.Complete = true

	cases := []scriptCase{
		{
			name: "missing key", call: claim(5, two), pttl: ttlNone, want: claimed,
			state: func(a at) map[string]string {
				return with(map[string]string{testField: running(a.now+leaseMS, 1, "new")}, a.now, two)
			},
		},
		{
			name: "recorded fields with state keep it", pttl: ttlNone, want: claimed,
			call: claim(5, invocation.Record{Fields: []string{"b/one", "b/two", "b/three"}}),
			seed: func(now int64) map[string]string {
				return map[string]string{"b/one": "ok", "b/two": running(now+hourMS, 1, "old")}
			},
			state: func(a at) map[string]string {
				return map[string]string{"b/one": "ok", "b/two": running(a.seed+hourMS, 1, "old"),
					"b/three": nextAt(a.now, 0, "new"), testField: running(a.now+leaseMS, 1, "new")}
			},
		},
		{
			name: "running live", call: claim(5, two), pttl: ttlNone,
			seed: field(func(now int64) string { return running(now+hourMS, 2, "old") }),
			want: func(a at) any {
				return invocation.Claim{Status: invocation.Running, RunningUntil: time.UnixMilli(a.seed + hourMS), Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: 2}}
			},
			state: func(a at) map[string]string {
				return with(map[string]string{testField: running(a.seed+hourMS, 2, "old")}, a.now, two)
			},
		},
		{
			name: "next_attempt_at future", call: claim(5, two), pttl: ttlNone,
			seed: field(func(now int64) string { return nextAt(now+hourMS, 2, "old") }),
			want: func(a at) any {
				return invocation.Claim{Status: invocation.NotDue, NextAttemptAt: time.UnixMilli(a.seed + hourMS), Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: 2}}
			},
			state: func(a at) map[string]string {
				return with(map[string]string{testField: nextAt(a.seed+hourMS, 2, "old")}, a.now, two)
			},
		},
		{
			name: "next_attempt_at due", call: claim(5, two), pttl: ttlNone,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: nextAt(now-1000, 1, "old"), traceKey: tp1}
			},
			want: func(a at) any {
				return invocation.Claim{Status: invocation.Claimed, PrevTrace: tp1, Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: 2,
					Token: "new", Deadline: time.UnixMilli(a.now + leaseMS)}}
			},
			state: func(a at) map[string]string {
				return with(map[string]string{testField: running(a.now+leaseMS, 2, "new"), traceKey: tp1}, a.now, two)
			},
		},
		{
			name: "expired lease at max attempts", call: claim(2, two), pttl: ttlNone,
			seed: field(func(now int64) string { return running(now-1000, 2, "old") }),
			want: func(a at) any {
				return invocation.Claim{Status: invocation.Exhausted, Lost: 2, Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: 2, Token: "new"}}
			},
			state: func(a at) map[string]string {
				return with(map[string]string{testField: exhausted(2, "new")}, a.now, two)
			},
		},
		{
			name: "ok", call: claim(5, two), pttl: ttlNone,
			seed: field(func(int64) string { return "ok" }),
			want: func(at) any { return invocation.Claim{Status: invocation.Succeeded} },
			state: func(a at) map[string]string {
				return with(map[string]string{testField: "ok"}, a.now, two)
			},
		},
		{
			name: "dead-lettered", call: claim(5, two), pttl: ttlNone,
			seed: field(func(int64) string { return dead(3, "old") }),
			want: func(a at) any {
				return invocation.Claim{Status: invocation.DeadLettered, Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: 3, Token: "old"}}
			},
			state: func(a at) map[string]string {
				return with(map[string]string{testField: dead(3, "old")}, a.now, two)
			},
		},
		{
			name: "malformed", call: claim(5, two), pttl: ttlNone, wantSomeErr: true,
			seed: field(func(int64) string { return "garbage" }),
			state: func(a at) map[string]string {
				return with(map[string]string{testField: "garbage"}, a.now, two)
			},
		},
		{
			name: "terminal records nothing", call: claim(5, two), pttl: ttlHour, seedTTL: ttlHour,
			seed: func(int64) map[string]string { return map[string]string{terminalField: "1"} },
			want: func(at) any { return invocation.Claim{Status: invocation.Terminal} },
		},
		{
			name: "large record", call: claim(5, large), pttl: ttlNone, want: claimed,
			seed: func(int64) map[string]string { return largeSeed },
			state: func(a at) map[string]string {
				m := with(largeSeed, a.now, large)
				m[testField] = running(a.now+leaseMS, 1, "new")
				return m
			},
		},
	}
	runScriptCases(t, cases)
}

// TestClaimScriptProbe: a probe (ClaimRequest.Probe) is decided as a claim
// is, but where a claim would take an attempt it records the field due
// now with its attempts unchanged (a lost attempt charged) and reports
// Probed; where a claim takes none, it finds what the claim finds.
func TestClaimScriptProbe(t *testing.T) {
	const lease = 30 * time.Second
	probe := func(maxAttempts int, rec invocation.Record) func(ctx context.Context, e *env) (any, error) {
		return claimCall(func(e *env) invocation.ClaimRequest {
			r := e.req(lease, maxAttempts)
			r.Probe, r.Record = true, rec
			return r
		})
	}
	probed := func(attempts, lost int) func(a at) any {
		return func(a at) any {
			return invocation.Claim{Status: invocation.Probed, Lost: lost, Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: attempts, Token: "new"}}
		}
	}
	found := func(st invocation.Status, attempt int, token string, lost int) func(a at) any {
		return func(a at) any {
			return invocation.Claim{Status: st, Lost: lost, Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: attempt, Token: token}}
		}
	}
	fixed := func(c invocation.Claim) func(at) any { return func(at) any { return c } }
	dueNow := func(attempts int) func(a at) map[string]string {
		return fieldAt(func(a at) string { return nextAt(a.now, attempts, "new") })
	}
	cases := []scriptCase{
		{name: "no state", call: probe(5, invocation.Record{}), pttl: ttlNone, want: probed(0, 0), state: dueNow(0)},
		{
			name: "no state, with a record", call: probe(5, invocation.Record{Fields: []string{"b/one"}, Complete: true}), pttl: ttlNone,
			want: probed(0, 0),
			state: func(a at) map[string]string {
				return map[string]string{testField: nextAt(a.now, 0, "new"), "b/one": nextAt(a.now, 0, "new"), matchedField: "1"}
			},
		},
		{
			name: "due retry", call: probe(5, invocation.Record{}), pttl: ttlNone, want: probed(2, 0),
			seed: func(now int64) map[string]string {
				return map[string]string{testField: nextAt(now-1000, 2, "old"), traceKey: tp1}
			},
			state: func(a at) map[string]string {
				return map[string]string{testField: nextAt(a.now, 2, "new"), traceKey: tp1}
			},
		},
		{
			name: "released attempt due", call: probe(2, invocation.Record{}), pttl: ttlNone, want: probed(1, 0),
			seed: field(func(now int64) string { return nextAt(now, 1, "old") }), state: dueNow(1),
		},
		{
			// The lost attempt is charged once, by the probe; none is taken.
			name: "expired lease", call: probe(5, invocation.Record{}), pttl: ttlNone, want: probed(2, 2),
			seed: field(func(now int64) string { return running(now-1000, 2, "old") }), state: dueNow(2),
		},
		{
			name: "expired lease at max attempts", call: probe(2, invocation.Record{}), pttl: ttlNone,
			seed:  field(func(now int64) string { return running(now-1000, 2, "old") }),
			want:  found(invocation.Exhausted, 2, "new", 2),
			state: fieldAt(func(at) string { return exhausted(2, "new") }),
		},
		{
			name: "due retry at max attempts", call: probe(4, invocation.Record{}), pttl: ttlNone,
			seed:  field(func(now int64) string { return nextAt(now-1000, 4, "old") }),
			want:  found(invocation.Exhausted, 4, "new", 0),
			state: fieldAt(func(at) string { return exhausted(4, "new") }),
		},
		{
			name: "live lease", call: probe(5, invocation.Record{}), pttl: ttlNone,
			seed: field(func(now int64) string { return running(now+hourMS, 2, "old") }),
			want: func(a at) any {
				return invocation.Claim{Status: invocation.Running, RunningUntil: time.UnixMilli(a.seed + hourMS), Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: 2}}
			},
		},
		{
			name: "not due", call: probe(5, invocation.Record{}), pttl: ttlNone,
			seed: field(func(now int64) string { return nextAt(now+hourMS, 2, "old") }),
			want: func(a at) any {
				return invocation.Claim{Status: invocation.NotDue, NextAttemptAt: time.UnixMilli(a.seed + hourMS), Lease: invocation.Lease{Key: a.key, Field: testField, Attempt: 2}}
			},
		},
		{
			name: "exhausted", call: probe(5, invocation.Record{}), pttl: ttlNone,
			seed: field(func(int64) string { return exhausted(3, "old") }),
			want: found(invocation.Exhausted, 3, "old", 0),
		},
		{
			name: "dead-lettered", call: probe(5, invocation.Record{}), pttl: ttlNone,
			seed: field(func(int64) string { return dead(3, "old") }),
			want: found(invocation.DeadLettered, 3, "old", 0),
		},
		{
			name: "ok", call: probe(5, invocation.Record{}), pttl: ttlNone,
			seed: field(func(int64) string { return "ok" }),
			want: fixed(invocation.Claim{Status: invocation.Succeeded}),
		},
		{
			name: "terminal", call: probe(5, invocation.Record{}), pttl: ttlHour, seedTTL: ttlHour,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: running(now-1000, 1, "old"), terminalField: "1"}
			},
			want: fixed(invocation.Claim{Status: invocation.Terminal}),
		},
		{
			name: "acknowledged", call: probe(5, invocation.Record{Fields: []string{"b/one"}}), pttl: ttlNoKey, message: "acked",
			want: fixed(invocation.Claim{Status: invocation.Terminal, NotPending: true}),
		},
		{
			name: "malformed", call: probe(5, invocation.Record{}), pttl: ttlNone, wantSomeErr: true,
			seed: field(func(int64) string { return "garbage" }),
		},
	}
	runScriptCases(t, cases)
}

// prefixed returns cases with their names prefixed.
func prefixed(prefix string, cases []scriptCase) []scriptCase {
	out := make([]scriptCase, len(cases))
	for i, c := range cases {
		c.name = prefix + c.name
		out[i] = c
	}
	return out
}

// ackedAs is settleAs of the settlement of(l) with Ack at retention.
func ackedAs(of func(l invocation.Lease) invocation.Settlement, retention time.Duration) transition {
	return settleAs(func(l invocation.Lease) invocation.Settlement { return acked(of(l), retention) })
}

func oneOf(kind invocation.TransitionKind) func(l invocation.Lease) invocation.Settlement {
	return func(l invocation.Lease) invocation.Settlement { return one(kind, l) }
}

// TestSettleReleaseScript: a Release transition (settle.lua 'l') gives the
// running attempt back uncharged: due now with attempt-1 used.
func TestSettleReleaseScript(t *testing.T) {
	do := settleOf(invocation.Release)
	applied := results(invocation.TransitionResult{})
	cases := []scriptCase{
		{
			// Due at once with none used, and still listed by Unfinished.
			name: "first attempt", call: callWith(do, 1, "tok"), pttl: ttlNone, want: applied,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: runningLive(now, 1, "tok"), "other/handler": "ok"}
			},
			state: func(a at) map[string]string {
				return map[string]string{testField: nextAt(a.now, 0, "tok"), "other/handler": "ok"}
			},
		},
		{
			name: "later attempt", call: callWith(do, 2, "tok"), pttl: ttlNone, want: applied,
			seed:  field(func(now int64) string { return runningLive(now, 2, "tok") }),
			state: fieldAt(func(a at) string { return nextAt(a.now, 1, "tok") }),
		},
		{
			name: "expired lease", call: callWith(do, 2, "tok"), pttl: ttlNone, want: applied,
			seed:  field(func(now int64) string { return running(now-1000, 2, "tok") }),
			state: fieldAt(func(a at) string { return nextAt(a.now, 1, "tok") }),
		},
		{
			name: "first attempt stores its trace", call: callTraced(do, 1, "tok", tp2), pttl: ttlNone, want: applied,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: runningLive(now, 1, "tok"), traceKey: tp1}
			},
			state: func(a at) map[string]string {
				return map[string]string{testField: nextAt(a.now, 0, "tok"), traceKey: tp2}
			},
		},
		{
			name: "later attempt stores its trace", call: callTraced(do, 2, "tok", tp2), pttl: ttlNone, want: applied,
			seed: field(func(now int64) string { return runningLive(now, 2, "tok") }),
			state: func(a at) map[string]string {
				return map[string]string{testField: nextAt(a.now, 1, "tok"), traceKey: tp2}
			},
		},
		{
			name: "refused with Ack", call: callWith(ackedAs(oneOf(invocation.Release), time.Hour), 2, "tok"), pttl: ttlNone,
			wantSomeErr: true,
			seed:        field(func(now int64) string { return runningLive(now, 2, "tok") }),
		},
	}
	cases = append(cases, fencedRejects(do, runningLive, exhaustedSame, deadSame)...)
	cases = append(cases, traceRejects(do, runningLive)...)
	runScriptCases(t, cases)
}

// TestSettleFinishScript: a Finish transition (settle.lua 'f') records
// "ok" for the running attempt of its lease, and with Ack also
// acknowledges the message and retains its hash.
func TestSettleFinishScript(t *testing.T) {
	do := settleOf(invocation.Finish)
	applied := results(invocation.TransitionResult{})
	cases := []scriptCase{
		{
			name: "running", call: callWith(do, 2, "tok"), pttl: ttlNone, want: applied,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: runningLive(now, 2, "tok"), "other/handler": running(1, 1, "x")}
			},
			state: func(at) map[string]string {
				return map[string]string{testField: "ok", "other/handler": running(1, 1, "x")}
			},
		},
		{
			name: "expired lease nobody took", call: callWith(do, 2, "tok"), pttl: ttlNone, want: applied,
			seed:  field(func(now int64) string { return running(now-1000, 2, "tok") }),
			state: fieldAt(func(at) string { return "ok" }),
		},
		{
			name: "stores no trace", call: callTraced(do, 2, "tok", tp2), pttl: ttlNone, want: applied,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: runningLive(now, 2, "tok"), traceKey: tp1}
			},
			state: func(at) map[string]string { return map[string]string{testField: "ok", traceKey: tp1} },
		},
		{
			name: "and acknowledge", call: callWith(ackedAs(oneOf(invocation.Finish), time.Hour), 2, "tok"), acked: true,
			pttl: ttlHour, want: applied,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: runningLive(now, 2, "tok"), "other/handler": dead(1, "x")}
			},
			state: func(at) map[string]string {
				return map[string]string{testField: "ok", "other/handler": dead(1, "x"), terminalField: "1"}
			},
		},
		{
			name: "and acknowledge at retention 0", call: callWith(ackedAs(oneOf(invocation.Finish), 0), 2, "tok"), acked: true,
			pttl: ttlNoKey, want: applied,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: runningLive(now, 2, "tok"), traceKey: tp1}
			},
			state: func(at) map[string]string { return map[string]string{} },
		},
	}
	cases = append(cases, fencedRejects(do, runningLive, exhaustedSame, deadSame)...)
	cases = append(cases, prefixed("ack/", fencedRejects(ackedAs(oneOf(invocation.Finish), time.Hour), runningLive, exhaustedSame, deadSame))...)
	cases = append(cases, prefixed("ack at retention 0/", fencedRejects(ackedAs(oneOf(invocation.Finish), 0), runningLive))...)
	runScriptCases(t, cases)
}

// TestSettleRetryScript: a Retry transition (settle.lua 'r') records the
// failure of the running attempt and the earliest time of the next one,
// the server's now + Backoff, which it returns.
func TestSettleRetryScript(t *testing.T) {
	next := func(ms int64) func(a at) any {
		return func(a at) any { return []invocation.TransitionResult{{Next: time.UnixMilli(a.now + ms)}} }
	}
	cases := []scriptCase{
		{
			name: "running", call: callWith(retryIn(time.Minute), 2, "tok"), pttl: ttlNone,
			seed:  field(func(now int64) string { return runningLive(now, 2, "tok") }),
			want:  next(60_000),
			state: fieldAt(func(a at) string { return nextAt(a.now+60_000, 2, "tok") }),
		},
		{
			name: "zero backoff", call: callWith(retryIn(0), 1, "tok"), pttl: ttlNone,
			seed:  field(func(now int64) string { return runningLive(now, 1, "tok") }),
			want:  next(0),
			state: fieldAt(func(a at) string { return nextAt(a.now, 1, "tok") }),
		},
		{
			name: "negative backoff", call: callWith(retryIn(-time.Second), 2, "tok"), pttl: ttlNone,
			wantSomeErr: true,
			seed:        field(func(now int64) string { return runningLive(now, 2, "tok") }),
		},
		{
			name: "stores the trace over an older one", call: callTraced(retryIn(time.Minute), 2, "tok", tp2), pttl: ttlNone,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: runningLive(now, 2, "tok"), traceKey: tp1}
			},
			want: next(60_000),
			state: func(a at) map[string]string {
				return map[string]string{testField: nextAt(a.now+60_000, 2, "tok"), traceKey: tp2}
			},
		},
		{
			name: "no trace keeps the stored one", call: callWith(retryIn(time.Minute), 2, "tok"), pttl: ttlNone,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: runningLive(now, 2, "tok"), traceKey: tp1}
			},
			want: next(60_000),
			state: func(a at) map[string]string {
				return map[string]string{testField: nextAt(a.now+60_000, 2, "tok"), traceKey: tp1}
			},
		},
		{
			name: "refused with Ack", call: callWith(ackedAs(oneOf(invocation.Retry), time.Hour), 2, "tok"), pttl: ttlNone,
			wantSomeErr: true,
			seed:        field(func(now int64) string { return runningLive(now, 2, "tok") }),
		},
	}
	cases = append(cases, fencedRejects(retryIn(time.Minute), runningLive, exhaustedSame, deadSame)...)
	cases = append(cases, traceRejects(retryIn(time.Minute), runningLive)...)
	runScriptCases(t, cases)
}

// TestSettleExhaustScript: an Exhaust transition (settle.lua 'x') records
// the failure of the last attempt and writes its dead-letter entry in the
// same step: exhausted:<attempt>:<token>:dlq. One applied before (the
// field holds that value already: a retry after a lost reply) writes no
// second entry.
func TestSettleExhaustScript(t *testing.T) {
	do := settleOf(invocation.Exhaust)
	wrote := func(a at) any { return []invocation.TransitionResult{{DLQID: a.dlqID(0)}} }
	none := results(invocation.TransitionResult{})
	cases := []scriptCase{
		{
			name: "running", call: callWith(do, 2, "tok"), pttl: ttlNone, want: wrote,
			seed:  field(func(now int64) string { return runningLive(now, 2, "tok") }),
			state: fieldAt(func(at) string { return dead(2, "tok") }),
			dlq:   entries(leaseOf(2, "tok", "")),
		},
		{
			name: "expired lease nobody took", call: callWith(do, 2, "tok"), pttl: ttlNone, want: wrote,
			seed:  field(func(now int64) string { return running(now-1000, 2, "tok") }),
			state: fieldAt(func(at) string { return dead(2, "tok") }),
			dlq:   entries(leaseOf(2, "tok", "")),
		},
		{
			name: "stores the trace", call: callTraced(do, 2, "tok", tp2), pttl: ttlNone, want: wrote,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: runningLive(now, 2, "tok"), traceKey: tp1}
			},
			state: func(at) map[string]string { return map[string]string{testField: dead(2, "tok"), traceKey: tp2} },
			dlq:   entries(leaseOf(2, "tok", tp2)),
		},
		{
			name: "applied before writes no second entry", call: callWith(do, 2, "tok"), pttl: ttlNone, want: none,
			seed: field(deadSame),
		},
		{
			name: "applied before keeps the stored trace", call: callTraced(do, 2, "tok", tp2), pttl: ttlNone, want: none,
			seed: func(int64) map[string]string { return map[string]string{testField: dead(2, "tok"), traceKey: tp1} },
		},
		{
			name: "applied before, acknowledged since", call: callWith(do, 2, "tok"), pttl: ttlNone, wantErr: invocation.ErrTerminal,
			message: "acked", seed: field(deadSame),
		},
		{
			name: "marked by another token", call: callWith(do, 2, "tok"), pttl: ttlNone, wantErr: invocation.ErrStale,
			seed: field(func(int64) string { return dead(2, "other") }),
		},
		{
			name: "marked at another attempt", call: callWith(do, 2, "tok"), pttl: ttlNone, wantErr: invocation.ErrStale,
			seed: field(func(int64) string { return dead(1, "tok") }),
		},
		{
			name: "and acknowledge", call: callWith(ackedAs(oneOf(invocation.Exhaust), time.Hour), 2, "tok"), acked: true,
			pttl: ttlHour, want: wrote,
			seed: func(now int64) map[string]string {
				return map[string]string{testField: runningLive(now, 2, "tok"), "other/handler": "ok"}
			},
			state: func(at) map[string]string {
				return map[string]string{testField: dead(2, "tok"), "other/handler": "ok", terminalField: "1"}
			},
			dlq: entries(leaseOf(2, "tok", "")),
		},
		{
			name: "and acknowledge at retention 0", call: callTraced(ackedAs(oneOf(invocation.Exhaust), 0), 2, "tok", tp2), acked: true,
			pttl: ttlNoKey, want: wrote,
			seed:  field(func(now int64) string { return runningLive(now, 2, "tok") }),
			state: func(at) map[string]string { return map[string]string{} },
			dlq:   entries(leaseOf(2, "tok", tp2)),
		},
		{
			name: "applied before, and acknowledge", call: callWith(ackedAs(oneOf(invocation.Exhaust), time.Hour), 2, "tok"), acked: true,
			pttl: ttlHour, want: none,
			seed:  field(deadSame),
			state: func(at) map[string]string { return map[string]string{testField: dead(2, "tok"), terminalField: "1"} },
		},
		{
			name: "refused without an entry", pttl: ttlNone, wantSomeErr: true,
			call: callWith(settleAs(func(l invocation.Lease) invocation.Settlement {
				st := one(invocation.Exhaust, l)
				st.Transitions[0].Entry = nil
				return st
			}), 2, "tok"),
			seed: field(func(now int64) string { return runningLive(now, 2, "tok") }),
		},
		{
			name: "refused with an invalid entry", pttl: ttlNone, wantSomeErr: true,
			call: callWith(settleAs(func(l invocation.Lease) invocation.Settlement {
				st := one(invocation.Exhaust, l)
				st.Transitions[0].Entry.Reason = ""
				return st
			}), 2, "tok"),
			seed: field(func(now int64) string { return runningLive(now, 2, "tok") }),
		},
	}
	cases = append(cases, fencedRejects(do, runningLive, exhaustedSame)...)
	cases = append(cases, traceRejects(do, runningLive)...)
	cases = append(cases, prefixed("ack/", fencedRejects(ackedAs(oneOf(invocation.Exhaust), time.Hour), runningLive, exhaustedSame))...)
	runScriptCases(t, cases)
}

// TestSettleDeadLetterScript: a DeadLetter transition (settle.lua 'd')
// writes the entry of an invocation a claim found exhausted and marks it
// written; one already marked is left as it is and writes nothing.
func TestSettleDeadLetterScript(t *testing.T) {
	do := settleOf(invocation.DeadLetter)
	wrote := func(a at) any { return []invocation.TransitionResult{{DLQID: a.dlqID(0)}} }
	none := results(invocation.TransitionResult{})
	cases := []scriptCase{
		{
			name: "exhausted", call: callWith(do, 2, "tok"), pttl: ttlNone, want: wrote,
			seed:  field(exhaustedSame),
			state: fieldAt(func(at) string { return dead(2, "tok") }),
			dlq:   entries(leaseOf(2, "tok", "")),
		},
		{
			name: "already marked writes nothing", call: callWith(do, 2, "tok"), pttl: ttlNone, want: none,
			seed: field(deadSame),
		},
		{
			name: "marked by another token", call: callWith(do, 2, "tok"), pttl: ttlNone, wantErr: invocation.ErrStale,
			seed: field(func(int64) string { return dead(2, "other") }),
		},
		{
			name: "marked at another attempt", call: callWith(do, 2, "tok"), pttl: ttlNone, wantErr: invocation.ErrStale,
			seed: field(func(int64) string { return dead(3, "tok") }),
		},
		{
			name: "unknown suffix", call: callWith(do, 2, "tok"), pttl: ttlNone, wantErr: invocation.ErrStale,
			seed: field(func(int64) string { return exhausted(2, "tok") + ":xyz" }),
		},
		{
			name: "stores no trace", call: callTraced(do, 2, "tok", tp2), pttl: ttlNone, want: wrote,
			seed: func(int64) map[string]string { return map[string]string{testField: exhausted(2, "tok"), traceKey: tp1} },
			state: func(at) map[string]string {
				return map[string]string{testField: dead(2, "tok"), traceKey: tp1}
			},
			dlq: entries(leaseOf(2, "tok", tp2)),
		},
		{
			name: "and acknowledge", call: callWith(ackedAs(oneOf(invocation.DeadLetter), time.Hour), 2, "tok"), acked: true,
			pttl: ttlHour, want: wrote,
			seed:  field(exhaustedSame),
			state: func(at) map[string]string { return map[string]string{testField: dead(2, "tok"), terminalField: "1"} },
			dlq:   entries(leaseOf(2, "tok", "")),
		},
		{
			name: "already marked, and acknowledge at retention 0", call: callWith(ackedAs(oneOf(invocation.DeadLetter), 0), 2, "tok"),
			acked: true, pttl: ttlNoKey, want: none,
			seed:  field(deadSame),
			state: func(at) map[string]string { return map[string]string{} },
		},
		{
			name: "refused without an entry", pttl: ttlNone, wantSomeErr: true,
			call: callWith(settleAs(func(l invocation.Lease) invocation.Settlement {
				st := one(invocation.DeadLetter, l)
				st.Transitions[0].Entry = nil
				return st
			}), 2, "tok"),
			seed: field(exhaustedSame),
		},
	}
	cases = append(cases, fencedRejects(do, exhaustedValue, runningSame)...)
	cases = append(cases, prefixed("ack/", fencedRejects(ackedAs(oneOf(invocation.DeadLetter), time.Hour), exhaustedValue, runningSame))...)
	runScriptCases(t, cases)
}

// TestSettleAllOrNothing: a settlement applies all its transitions or
// none: when one of them is stale, the others (whichever comes first)
// write nothing, no dead-letter entry is written and the message is not
// acknowledged.
func TestSettleAllOrNothing(t *testing.T) {
	const other = "b/handler"
	lease := func(key invocation.Key, f string) invocation.Lease {
		return invocation.Lease{Key: key, Field: f, Attempt: 2, Token: "tok"}
	}
	// pair settles testField with a and other with b.
	pair := func(a, b invocation.TransitionKind, ack bool) func(ctx context.Context, e *env) (any, error) {
		return func(ctx context.Context, e *env) (any, error) {
			st := one(a, lease(e.key, testField))
			st.Transitions = append(st.Transitions, one(b, lease(e.key, other)).Transitions...)
			if ack {
				st = acked(st, time.Hour)
			}
			r := settleOne(ctx, e.s, st)
			return r.Transitions, r.Err
		}
	}
	seed := func(a, b string) func(now int64) map[string]string {
		return func(now int64) map[string]string {
			return map[string]string{testField: strings.ReplaceAll(a, "NOW", fmt.Sprint(now+hourMS)),
				other: strings.ReplaceAll(b, "NOW", fmt.Sprint(now+hourMS))}
		}
	}
	live, stale := "running:NOW:2:tok", "running:NOW:2:someone-else"
	cases := []scriptCase{
		{name: "exhaust, then a stale finish", call: pair(invocation.Exhaust, invocation.Finish, false), seed: seed(live, stale), wantErr: invocation.ErrStale, pttl: ttlNone},
		{name: "finish, then a stale exhaust", call: pair(invocation.Finish, invocation.Exhaust, false), seed: seed(live, stale), wantErr: invocation.ErrStale, pttl: ttlNone},
		{name: "stale finish, then an exhaust", call: pair(invocation.Finish, invocation.Exhaust, false), seed: seed(stale, live), wantErr: invocation.ErrStale, pttl: ttlNone},
		{name: "retry, then a stale release", call: pair(invocation.Retry, invocation.Release, false), seed: seed(live, stale), wantErr: invocation.ErrStale, pttl: ttlNone},
		{name: "exhaust, then a stale dead-letter", call: pair(invocation.Exhaust, invocation.DeadLetter, false), seed: seed(live, exhausted(2, "someone-else")), wantErr: invocation.ErrStale, pttl: ttlNone},
		{name: "exhaust, then a dead-letter of a running field", call: pair(invocation.Exhaust, invocation.DeadLetter, false), seed: seed(live, live), wantErr: invocation.ErrStale, pttl: ttlNone},
		{name: "ack: finish, then a stale finish", call: pair(invocation.Finish, invocation.Finish, true), seed: seed(live, stale), wantErr: invocation.ErrStale, pttl: ttlNone},
		{name: "ack: exhaust, then a stale exhaust", call: pair(invocation.Exhaust, invocation.Exhaust, true), seed: seed(live, stale), wantErr: invocation.ErrStale, pttl: ttlNone},
		{name: "ack: exhaust, then a missing field", call: pair(invocation.Exhaust, invocation.Finish, true), wantErr: invocation.ErrStale, pttl: ttlNone,
			seed: func(now int64) map[string]string { return map[string]string{testField: runningLive(now, 2, "tok")} }},
		{
			name: "ack: both apply", call: pair(invocation.Exhaust, invocation.Finish, true), seed: seed(live, live), pttl: ttlHour, acked: true,
			want: func(a at) any { return []invocation.TransitionResult{{DLQID: a.dlqID(0)}, {}} },
			state: func(at) map[string]string {
				return map[string]string{testField: dead(2, "tok"), other: "ok", terminalField: "1"}
			},
			dlq: entries(leaseOf(2, "tok", "")),
		},
		{
			name: "exhaust, and one applied before", call: pair(invocation.Exhaust, invocation.Exhaust, false), seed: seed(live, dead(2, "tok")), pttl: ttlNone,
			want:  func(a at) any { return []invocation.TransitionResult{{DLQID: a.dlqID(0)}, {}} },
			state: func(at) map[string]string { return map[string]string{testField: dead(2, "tok"), other: dead(2, "tok")} },
			dlq:   entries(leaseOf(2, "tok", "")),
		},
	}
	runScriptCases(t, cases)
}

// TestSettleAckScript: an Ack settlement without transitions
// acknowledges the message and applies the retention to its hash: kept
// with __terminal and a TTL, or deleted with retention 0; a Stateless one
// acknowledges alone. A message no longer pending is left alone and
// ErrTerminal returned.
func TestSettleAckScript(t *testing.T) {
	ack := func(retention time.Duration, stateless bool) func(ctx context.Context, e *env) (any, error) {
		return func(ctx context.Context, e *env) (any, error) {
			r := settleOne(ctx, e.s, invocation.Settlement{Key: e.key, Ack: true, Stateless: stateless, Retention: retention})
			return r.Transitions, r.Err
		}
	}
	done := func(int64) map[string]string {
		return map[string]string{testField: "ok", "other/handler": dead(2, "tok"), traceKey: tp1}
	}
	retained := func(a at) map[string]string {
		m := done(a.seed)
		m[terminalField] = "1"
		return m
	}
	noKey := func(at) map[string]string { return map[string]string{} }
	cases := []scriptCase{
		{name: "retains", call: ack(time.Hour, false), seed: done, state: retained, pttl: ttlHour, acked: true},
		{name: "retention 0 deletes", call: ack(0, false), seed: done, state: noKey, pttl: ttlNoKey, acked: true},
		{name: "no state creates none", call: ack(time.Hour, false), pttl: ttlNoKey, acked: true},
		{name: "stateless", call: ack(time.Hour, true), pttl: ttlNoKey, acked: true},
		{name: "stateless at retention 0", call: ack(0, true), pttl: ttlNoKey, acked: true},
		{name: "stateless touches no hash", call: ack(time.Hour, true), seed: done, pttl: ttlNone, acked: true},
		{
			name: "retained hash keeps its TTL", call: ack(7*24*time.Hour, false), acked: true,
			seed:    func(int64) map[string]string { return map[string]string{testField: "ok", terminalField: "1"} },
			seedTTL: ttlHour, pttl: ttlHour,
		},
		{name: "acknowledged", call: ack(time.Hour, false), message: "acked", seed: done, pttl: ttlNone, wantErr: invocation.ErrTerminal},
		{name: "acknowledged, retention 0", call: ack(0, false), message: "acked", seed: done, pttl: ttlNone, wantErr: invocation.ErrTerminal},
		{name: "acknowledged, stateless", call: ack(0, true), message: "acked", pttl: ttlNoKey, wantErr: invocation.ErrTerminal},
		{name: "group gone", call: ack(0, false), message: "no group", seed: done, pttl: ttlNone, wantErr: invocation.ErrTerminal},
		{name: "stream gone", call: ack(time.Hour, false), message: "no stream", seed: done, pttl: ttlNone, wantErr: invocation.ErrTerminal},
		{name: "negative retention", call: ack(-time.Second, false), seed: done, pttl: ttlNone, wantSomeErr: true},
	}
	runScriptCases(t, cases)
}

// TestSettleClearedScript: a Cleared settlement applies the retention to
// the hash of a message that is no longer pending (its PEL reference was
// cleared), and does nothing while it is pending.
func TestSettleClearedScript(t *testing.T) {
	retain := func(ttl time.Duration) func(ctx context.Context, e *env) (any, error) {
		return func(ctx context.Context, e *env) (any, error) {
			r := settleOne(ctx, e.s, invocation.Settlement{Key: e.key, Cleared: true, Retention: ttl})
			return r.Transitions, r.Err
		}
	}
	const week = 7 * 24 * time.Hour
	unfinished := func(now int64) map[string]string {
		return map[string]string{testField: "ok", "other/handler": running(now+hourMS, 1, "tok")}
	}
	retained := func(int64) map[string]string { return map[string]string{testField: "ok", terminalField: "1"} }
	none := func(at) map[string]string { return map[string]string{} }
	cases := []scriptCase{
		{name: "missing key", call: retain(week), pttl: ttlNoKey, message: "acked"},
		{
			name: "fresh key", call: retain(week), pttl: week, seed: unfinished, message: "acked",
			state: func(a at) map[string]string {
				m := unfinished(a.seed)
				m[terminalField] = "1"
				return m
			},
		},
		{
			name: "already retained keeps the TTL", call: retain(week), pttl: ttlHour, seedTTL: ttlHour,
			seed: retained, message: "acked",
		},
		{name: "already retained without TTL", call: retain(week), pttl: week, seed: retained, message: "acked"},
		{name: "zero retention deletes", call: retain(0), pttl: ttlNoKey, seed: unfinished, message: "acked", state: none},
		{name: "zero retention deletes a retained hash", call: retain(0), pttl: ttlNoKey, seedTTL: ttlHour, seed: retained, message: "acked", state: none},
		{name: "zero retention, missing key", call: retain(0), pttl: ttlNoKey, message: "acked"},
		{name: "group gone", call: retain(week), pttl: week, seed: retained, message: "no group"},
		{name: "still pending", call: retain(week), pttl: ttlNone, wantSomeErr: true, seed: unfinished},
		{name: "still pending, zero retention", call: retain(0), pttl: ttlNone, wantSomeErr: true, seed: unfinished},
		{name: "negative retention", call: retain(-time.Second), pttl: ttlNone, wantSomeErr: true, seed: unfinished, message: "acked"},
		{
			name: "refused with Ack", pttl: ttlNone, wantSomeErr: true, seed: unfinished,
			call: func(ctx context.Context, e *env) (any, error) {
				return nil, apply(ctx, e.s, invocation.Settlement{Key: e.key, Cleared: true, Ack: true, Retention: week})
			},
		},
		{
			name: "refused with a transition", pttl: ttlNone, wantSomeErr: true, message: "acked",
			seed: func(now int64) map[string]string { return map[string]string{testField: runningLive(now, 1, "tok")} },
			call: func(ctx context.Context, e *env) (any, error) {
				st := one(invocation.Finish, e.lease(1, "tok"))
				st.Cleared, st.Retention = true, week
				return nil, apply(ctx, e.s, st)
			},
		},
	}
	runScriptCases(t, cases)
}

// messageIn leaves e.key's message, pending in e.key.Group since newEnv,
// in state: "pending" as it is, "acked" acknowledged, "no group" with its
// group destroyed (another group exists), "no stream" with its stream
// deleted.
func messageIn(ctx context.Context, e *env, state string) error {
	c, k := e.c, e.key
	switch state {
	case "acked":
		return c.Do(ctx, c.B().Xack().Key(k.Stream).Group(k.Group).Id(k.MessageID).Build()).Error()
	case "no group":
		for _, r := range c.DoMulti(ctx,
			c.B().XgroupDestroy().Key(k.Stream).Group(k.Group).Build(),
			c.B().XgroupCreate().Key(k.Stream).Group("another").Id("0").Build()) {
			if err := r.Error(); err != nil {
				return err
			}
		}
	case "no stream":
		return c.Do(ctx, c.B().Del().Key(k.Stream).Build()).Error()
	}
	return nil
}

func TestRetainAckedScript(t *testing.T) {
	const week = 7 * 24 * time.Hour
	retainAcked := func(ttl time.Duration) func(ctx context.Context, e *env) (any, error) {
		return func(ctx context.Context, e *env) (any, error) {
			return e.s.RetainAcked(ctx, e.key, ttl)
		}
	}
	status := func(st LeakStatus) func(at) any { return func(at) any { return st } }
	leaked := func(int64) map[string]string {
		return map[string]string{testField: "ok", "other/handler": dead(2, "tok")}
	}
	retainedLeak := func(at) map[string]string {
		m := leaked(0)
		m[terminalField] = "1"
		return m
	}
	terminal := func(int64) map[string]string { return map[string]string{testField: "ok", terminalField: "1"} }
	cases := []scriptCase{
		{
			name: "acked without TTL", call: retainAcked(week), message: "acked", pttl: week,
			seed: leaked, want: status(LeakRetained), state: retainedLeak,
		},
		{
			name: "pending", call: retainAcked(week), pttl: ttlNone,
			seed: leaked, want: status(LeakPending),
		},
		{
			name: "pending unfinished", call: retainAcked(week), pttl: ttlNone,
			seed: field(func(now int64) string { return nextAt(now+hourMS, 1, "tok") }), want: status(LeakPending),
		},
		{
			name: "acked with TTL", call: retainAcked(week), message: "acked", pttl: ttlHour, seedTTL: ttlHour,
			seed: leaked, want: status(LeakHasTTL),
		},
		{
			name: "terminal with TTL", call: retainAcked(week), message: "acked", pttl: ttlHour, seedTTL: ttlHour,
			seed: terminal, want: status(LeakHasTTL),
		},
		{
			name: "terminal without TTL", call: retainAcked(week), message: "acked", pttl: week,
			seed: terminal, want: status(LeakRetained),
		},
		{
			name: "terminal without TTL, pending again", call: retainAcked(week), pttl: ttlNone,
			seed: terminal, want: status(LeakPending),
		},
		{
			name: "missing key", call: retainAcked(week), message: "acked", pttl: ttlNoKey,
			want: status(LeakMissing),
		},
		{
			name: "no group", call: retainAcked(week), message: "no group", pttl: ttlNone,
			seed: leaked, want: status(LeakNoGroup),
		},
		{
			name: "no stream", call: retainAcked(week), message: "no stream", pttl: ttlNone,
			seed: leaked, want: status(LeakNoGroup),
		},
		{
			name: "zero retention deletes", call: retainAcked(0), message: "acked", pttl: ttlNoKey,
			seed: leaked, want: status(LeakRetained), state: func(at) map[string]string { return map[string]string{} },
		},
		{
			name: "zero retention, pending", call: retainAcked(0), pttl: ttlNone,
			seed: leaked, want: status(LeakPending),
		},
		{
			name: "zero retention, with TTL", call: retainAcked(0), message: "acked", pttl: ttlHour, seedTTL: ttlHour,
			seed: terminal, want: status(LeakHasTTL),
		},
		{
			name: "negative retention", call: retainAcked(-time.Second), message: "acked", pttl: ttlNone, wantSomeErr: true,
			seed: leaked,
		},
	}
	runScriptCases(t, cases)
}
