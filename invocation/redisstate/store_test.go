package redisstate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
)

// TestScriptsLoad runs SCRIPT LOAD on every embedded script and fails on a
// .lua file in scripts/ that no Go var uses or whose header is incomplete.
func TestScriptsLoad(t *testing.T) {
	c := newEnv(t, "").c
	files, err := filepath.Glob(filepath.Join("scripts", "*.lua"))
	if err != nil || len(files) == 0 {
		t.Fatalf("glob scripts: %v %v", files, err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		if name == "prelude.lua" {
			if !strings.HasPrefix(mustRead(name), "-- prelude.lua:") || len(helpers) == 0 {
				t.Errorf("%s: does not start with its header", f)
			}
			continue // its helpers are loaded with the scripts below
		}
		src, ok := scriptSources[name]
		if !ok {
			t.Errorf("%s: no Go var uses this script", f)
			continue
		}
		disk, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if string(disk) != src {
			t.Errorf("%s: embedded copy differs from the file", f)
		}
		for _, want := range []string{"-- " + name + ":", "KEYS[", "ARGV", "Returns "} {
			if !strings.Contains(src, want) {
				t.Errorf("%s: header lacks %q", f, want)
			}
		}
		if !strings.HasPrefix(src, "-- ") {
			t.Errorf("%s: does not start with a header comment", f)
		}
		if err := c.Do(t.Context(), c.B().ScriptLoad().Script(withHelpers(src)).Build()).Error(); err != nil {
			t.Errorf("%s: SCRIPT LOAD: %v", f, err)
		}
	}
	if len(scriptSources)+1 != len(files) {
		t.Errorf("%d scripts used, %d files in scripts/", len(scriptSources), len(files))
	}
}

// staleTransitions are the settlements a delivery holding lease l could
// write for l's invocation, each alone, without Ack.
func staleTransitions(l invocation.Lease) map[string]invocation.Settlement {
	retry := one(invocation.Retry, l)
	return map[string]invocation.Settlement{
		"finish":      one(invocation.Finish, l),
		"release":     one(invocation.Release, l),
		"retry":       retry,
		"exhaust":     one(invocation.Exhaust, l),
		"dead-letter": one(invocation.DeadLetter, l),
	}
}

// TestWithHelpers: each script gets the prelude helpers its code calls,
// directly or through another helper, and no other: not one its comments
// name, nor one named like a field it uses (string.match). Every helper
// is used by some script.
func TestWithHelpers(t *testing.T) {
	want := map[string][]string{
		"claim.lua":        {"now_ms", "now_us", "newer_id", "gate_pass", "pel_range", "in_pel", "pel_set", "prev_trace", "claim_one"},
		"settle.lua":       {"now_ms", "RUNNING", "EXHAUSTED", "pel_range", "in_pel", "retain"},
		"void.lua":         {"now_ms", "RUNNING", "pel_range", "in_pel"},
		"pin.lua":          {"pel_range", "in_pel"},
		"retain_acked.lua": {"retain"},
	}
	unused := map[string]bool{}
	for _, h := range helpers {
		unused[h.name] = true
	}
	for file, src := range scriptSources {
		var got []string
		full := withHelpers(src)
		for _, h := range helpers {
			if strings.Contains(full, h.src) {
				got = append(got, h.name)
				delete(unused, h.name)
			}
		}
		if diff := cmp.Diff(want[file], got); diff != "" {
			t.Errorf("%s: helpers (-want +got):\n%s", file, diff)
		}
	}
	if len(unused) > 0 {
		t.Errorf("helpers no script uses: %v", unused)
	}
	if got := withHelpers("-- in_pel\nreturn string.match('a', '(a)')"); got != "-- in_pel\nreturn string.match('a', '(a)')" {
		t.Errorf("a comment and a field pulled in helpers:\n%s", got)
	}
}

func TestClaimExpiredLeaseClaimsNextAttempt(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	first := mustClaim(t, e, 10*time.Millisecond, 5)
	if first.Status != invocation.Claimed || first.Lease.Attempt != 1 {
		t.Fatalf("first claim = %+v, want attempt 1 claimed", first)
	}
	next := claimWhenNotRunning(t, e, 10*time.Millisecond, 5)
	if next.Status != invocation.Claimed || next.Lease.Attempt != 2 || next.Lease.Token == first.Lease.Token {
		t.Fatalf("claim after expiry = %+v, want attempt 2 with a new token", next)
	}
	// The owner of the expired lease comes back: every transition is
	// stale, alone or acknowledging.
	for name, st := range staleTransitions(first.Lease) {
		if err := apply(ctx, e.s, st); !errors.Is(err, invocation.ErrStale) {
			t.Errorf("%s with the expired lease: %v, want ErrStale", name, err)
		}
		if name == "finish" || name == "exhaust" {
			if err := apply(ctx, e.s, acked(st, time.Hour)); !errors.Is(err, invocation.ErrStale) {
				t.Errorf("%s and ack with the expired lease: %v, want ErrStale", name, err)
			}
		}
	}
	if got := dlqEntries(t, e.c, e.key.Stream); len(got) != 0 {
		t.Errorf("stale transitions wrote dead-letter entries %v", got)
	}
	if err := apply(ctx, e.s, one(invocation.Finish, next.Lease)); err != nil {
		t.Fatalf("finish the new attempt: %v", err)
	}
	if got := mustClaim(t, e, time.Minute, 5); got.Status != invocation.Succeeded {
		t.Errorf("claim after finish = %v, want succeeded", got.Status)
	}
	if pending(t, e.c, e.key) != 1 {
		t.Errorf("the message is no longer pending")
	}
}

func TestClaimExpiredLeaseAtMaxAttemptsExhausts(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	first := mustClaim(t, e, 10*time.Millisecond, 1)
	got := claimWhenNotRunning(t, e, 10*time.Millisecond, 1)
	if got.Status != invocation.Exhausted || got.Lease.Attempt != 1 || got.Lease.Token == first.Lease.Token {
		t.Fatalf("claim after expiry of the last attempt = %+v, want exhausted at attempt 1 with a new token", got)
	}
	if err := apply(ctx, e.s, one(invocation.Exhaust, first.Lease)); !errors.Is(err, invocation.ErrStale) {
		t.Errorf("exhaust with the expired lease: %v, want ErrStale", err)
	}
	if got.Lost != 1 {
		t.Errorf("claim after expiry of the last attempt: Lost %d, want 1", got.Lost)
	}
	// Another delivery sees the same exhausted attempt and token; the lost
	// attempt was reported once.
	again := mustClaim(t, e, time.Minute, 1)
	want := got
	want.Lost = 0
	if diff := cmp.Diff(want, again); diff != "" {
		t.Errorf("second claim (-first +second):\n%s", diff)
	}
	r := settleOne(ctx, e.s, one(invocation.DeadLetter, got.Lease))
	if r.Err != nil {
		t.Fatalf("dead-letter: %v", r.Err)
	}
	ids, entries := withoutIDs(dlqEntries(t, e.c, e.key.Stream))
	if diff := cmp.Diff([]dlq.Entry{stored(got.Lease)}, entries); diff != "" {
		t.Errorf("dead-letter entries (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]invocation.TransitionResult{{DLQID: ids[0]}}, r.Transitions); len(ids) > 0 && diff != "" {
		t.Errorf("dead-letter result (-want +got):\n%s", diff)
	}
	if c := mustClaim(t, e, time.Minute, 1); c.Status != invocation.DeadLettered || c.Lease.Attempt != 1 {
		t.Errorf("claim after the dead-letter = %+v, want dead-lettered", c)
	}
}

func TestClaimRetryFlow(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	retry := func(l invocation.Lease, backoff time.Duration) invocation.SettleResult {
		t.Helper()
		st := one(invocation.Retry, l)
		st.Transitions[0].Backoff = backoff
		r := settleOne(ctx, e.s, st)
		if r.Err != nil {
			t.Fatalf("retry: %v", r.Err)
		}
		return r
	}
	c := mustClaim(t, e, time.Minute, 3)
	at := retry(c.Lease, time.Hour).Transitions[0].Next
	if nd := mustClaim(t, e, time.Minute, 3); nd.Status != invocation.NotDue || !nd.NextAttemptAt.Equal(at) {
		t.Fatalf("claim before the retry = %+v, want not due at %v", nd, at)
	}

	// Seed a retry that is due (in the past): the next attempt is claimed.
	e.seed(t, map[string]string{testField: nextAt(e.nowMS(t)-1, 1, c.Lease.Token)}, 0)
	c2 := mustClaim(t, e, time.Minute, 3)
	if c2.Status != invocation.Claimed || c2.Lease.Attempt != 2 {
		t.Fatalf("claim of a due retry = %+v, want attempt 2", c2)
	}

	// A short backoff passes: polled, not slept.
	retry(c2.Lease, 20*time.Millisecond)
	var c3 invocation.Claim
	testutil.WaitFor(t, 5*time.Second, "the retry to become due", func() bool {
		c3 = mustClaim(t, e, time.Minute, 3)
		return c3.Status != invocation.NotDue
	})
	if c3.Status != invocation.Claimed || c3.Lease.Attempt != 3 {
		t.Fatalf("claim of the third attempt = %+v", c3)
	}
	for i := range 2 { // idempotent: the second writes no entry
		r := settleOne(ctx, e.s, one(invocation.Exhaust, c3.Lease))
		if r.Err != nil || len(r.Transitions) != 1 || (r.Transitions[0].DLQID == "") != (i == 1) {
			t.Fatalf("exhaust %d = %+v, want applied, with an entry the first time only", i+1, r)
		}
	}
	ex := mustClaim(t, e, time.Minute, 3)
	if ex.Status != invocation.DeadLettered || ex.Lease.Attempt != 3 || ex.Lease.Token != c3.Lease.Token {
		t.Fatalf("claim after exhaust = %+v", ex)
	}
	if err := apply(ctx, e.s, invocation.Settlement{Key: e.key, Ack: true, Retention: invocation.DefaultRetention}); err != nil {
		t.Fatal(err)
	}
	hash, pttl := e.state(t)
	want := map[string]string{testField: dead(3, c3.Lease.Token), terminalField: "1"}
	if diff := cmp.Diff(want, hash); diff != "" {
		t.Errorf("final hash (-want +got):\n%s", diff)
	}
	checkPTTL(t, invocation.DefaultRetention, pttl)
	if _, got := withoutIDs(dlqEntries(t, e.c, e.key.Stream)); !cmp.Equal([]dlq.Entry{stored(c3.Lease)}, got) {
		t.Errorf("dead-letter entries %+v, want the one of attempt 3", got)
	}
	if pending(t, e.c, e.key) != 0 {
		t.Errorf("the message is still pending")
	}
}

func TestReleaseDoesNotChargeTheAttempt(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	c := mustClaim(t, e, time.Minute, 2)
	if err := apply(ctx, e.s, one(invocation.Release, c.Lease)); err != nil {
		t.Fatal(err)
	}
	c = mustClaim(t, e, time.Minute, 2)
	if c.Status != invocation.Claimed || c.Lease.Attempt != 1 {
		t.Fatalf("claim after releasing attempt 1 = %+v, want attempt 1", c)
	}
	if err := apply(ctx, e.s, one(invocation.Retry, c.Lease)); err != nil {
		t.Fatal(err)
	}
	c = mustClaim(t, e, time.Minute, 2)
	if c.Status != invocation.Claimed || c.Lease.Attempt != 2 {
		t.Fatalf("claim after a failed attempt 1 = %+v, want attempt 2", c)
	}
	if err := apply(ctx, e.s, one(invocation.Release, c.Lease)); err != nil {
		t.Fatal(err)
	}
	if err := apply(ctx, e.s, one(invocation.Release, c.Lease)); !errors.Is(err, invocation.ErrStale) {
		t.Errorf("second release: %v, want ErrStale", err)
	}
	c = mustClaim(t, e, time.Minute, 2)
	if c.Status != invocation.Claimed || c.Lease.Attempt != 2 {
		t.Fatalf("claim after releasing the last attempt = %+v, want attempt 2 again", c)
	}
}

// TestProbeThenClaim: a probe of an invocation whose lease expired
// charges the lost attempt and takes none, so the claim of the next
// delivery runs the attempt after the lost one, and reports no lost
// attempt a second time.
func TestProbeThenClaim(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	first := mustClaim(t, e, 10*time.Millisecond, 3)
	probe := e.req(time.Minute, 3)
	probe.Probe = true
	var p invocation.Claim
	testutil.WaitFor(t, 5*time.Second, "the running lease to expire", func() bool {
		var err error
		if p, err = claimOne(ctx, e.s, probe); err != nil {
			t.Fatalf("probe: %v", err)
		}
		return p.Status != invocation.Running
	})
	if p.Status != invocation.Probed || p.Lease.Attempt != 1 || p.Lost != 1 || p.Lease.Token == first.Lease.Token {
		t.Fatalf("probe after the lease expired = %+v, want probed, 1 attempt used, 1 lost", p)
	}
	if err := apply(ctx, e.s, one(invocation.Finish, first.Lease)); !errors.Is(err, invocation.ErrStale) {
		t.Errorf("finish with the expired lease after the probe: %v, want ErrStale", err)
	}
	// A second probe finds it due, with nothing more lost.
	if p2, err := claimOne(ctx, e.s, probe); err != nil || p2.Status != invocation.Probed || p2.Lease.Attempt != 1 || p2.Lost != 0 {
		t.Errorf("second probe = %+v, %v; want probed, 1 attempt used, none lost", p2, err)
	}
	c := mustClaim(t, e, time.Minute, 3)
	if c.Status != invocation.Claimed || c.Lease.Attempt != 2 || c.Lost != 0 {
		t.Fatalf("claim after the probes = %+v, want attempt 2 claimed, none lost", c)
	}
}

func TestClaimConcurrent(t *testing.T) {
	e := newEnv(t, "")
	const n = 50
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		counts = map[invocation.Status]int{}
		errs   []error
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			c, err := claimOne(t.Context(), e.s, e.req(time.Minute, 5))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			counts[c.Status]++
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("claim errors: %v", errs)
	}
	if diff := cmp.Diff(map[invocation.Status]int{invocation.Claimed: 1, invocation.Running: n - 1}, counts); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
}

// TestStaleDeliveryAfterAckIsInert: a delivery that claimed before another
// worker acknowledged the message, and held its lease in memory, changes
// nothing afterwards, with any retention: its transitions and new claims
// are refused, nothing runs, no dead-letter entry is written, and no state
// reappears, whether the ack path retained the hash (retention on) or
// deleted it (retention 0).
func TestStaleDeliveryAfterAckIsInert(t *testing.T) {
	for _, retention := range []time.Duration{0, time.Hour} {
		t.Run(fmt.Sprintf("retention %v", retention), func(t *testing.T) {
			e := newEnv(t, "")
			ctx := t.Context()
			c := mustClaim(t, e, time.Minute, 5)
			e.seed(t, map[string]string{"ex/handler": exhausted(2, "tok")}, 0)
			// Another worker settles the message.
			other := c.Lease
			other.Token = "another-worker"
			e.seed(t, map[string]string{testField: running(e.nowMS(t)+hourMS, 1, other.Token)}, 0)
			if err := apply(ctx, e.s, acked(one(invocation.Finish, other), retention)); err != nil {
				t.Fatalf("settle: %v", err)
			}
			before, ttlBefore := e.state(t)
			checkStaleInert(t, e, c.Lease, retention)
			after, ttlAfter := e.state(t)
			if diff := cmp.Diff(before, after); diff != "" {
				t.Errorf("hash changed (-before +after):\n%s", diff)
			}
			if retention == 0 && ttlAfter != -2 {
				t.Errorf("PTTL %d after the transitions, want no hash", ttlAfter)
			}
			if retention > 0 && (ttlAfter <= 0 || ttlAfter > ttlBefore) {
				t.Errorf("PTTL %d after the transitions, was %d", ttlAfter, ttlBefore)
			}
			if n := pending(t, e.c, e.key); n != 0 {
				t.Errorf("the message is pending again")
			}
			if got := dlqEntries(t, e.c, e.key.Stream); len(got) != 0 {
				t.Errorf("a stale delivery wrote dead-letter entries %v", got)
			}
		})
	}
}

// checkStaleInert runs every transition of a stale delivery holding lease
// l of e.key after its message left the PEL, and expects each refused.
func checkStaleInert(t *testing.T, e *env, l invocation.Lease, retention time.Duration) {
	t.Helper()
	ctx := t.Context()
	for _, f := range []string{l.Field, "new/handler"} {
		r := e.req(time.Minute, 5)
		r.Field = f
		for _, probe := range []bool{false, true} {
			r.Probe = probe
			if got, err := claimOne(ctx, e.s, r); err != nil || got.Status != invocation.Terminal {
				t.Errorf("claim of %s (probe %v) = %v %v, want terminal", f, probe, got.Status, err)
			}
		}
	}
	// A first delivery's claim records the message's other invocations:
	// after the ack it records nothing.
	rec := e.req(time.Minute, 5)
	rec.Field, rec.Record = "late/handler", invocation.Record{Fields: []string{"other/handler"}, Complete: true}
	if got, err := claimOne(ctx, e.s, rec); err != nil || got.Status != invocation.Terminal {
		t.Errorf("recording claim = %v %v, want terminal", got.Status, err)
	}
	exLease := invocation.Lease{Key: e.key, Field: "ex/handler", Attempt: 2, Token: "tok"}
	_, pinErr := e.s.Pin(ctx, e.key, "__schedule", "late")
	errs := map[string]error{
		"pin":                     pinErr,
		"dead-letter":             apply(ctx, e.s, one(invocation.DeadLetter, exLease)),
		"dead-letter and ack":     apply(ctx, e.s, acked(one(invocation.DeadLetter, exLease), retention)),
		"ack":                     apply(ctx, e.s, invocation.Settlement{Key: e.key, Ack: true, Retention: 7 * 24 * time.Hour}),
		"ack at retention 0":      apply(ctx, e.s, invocation.Settlement{Key: e.key, Ack: true}),
		"stateless ack":           apply(ctx, e.s, invocation.Settlement{Key: e.key, Ack: true, Stateless: true, Retention: time.Hour}),
		"finish and ack":          apply(ctx, e.s, acked(one(invocation.Finish, l), retention)),
		"exhaust and ack":         apply(ctx, e.s, acked(one(invocation.Exhaust, l), retention)),
		"finish and ack, another": apply(ctx, e.s, acked(one(invocation.Finish, l), 7*24*time.Hour)),
	}
	for name, st := range staleTransitions(l) {
		errs[name] = apply(ctx, e.s, st)
	}
	for name, err := range errs {
		if !errors.Is(err, invocation.ErrTerminal) {
			t.Errorf("%s: %v, want ErrTerminal", name, err)
		}
	}
	// Clearing applies the retention of a message no longer pending: it
	// keeps the running TTL and creates nothing.
	if err := apply(ctx, e.s, invocation.Settlement{Key: e.key, Cleared: true, Retention: 7 * 24 * time.Hour}); err != nil {
		t.Errorf("cleared: %v", err)
	}
	if u, err := e.s.Unfinished(ctx, e.key); err != nil || len(u.Fields) != 0 {
		t.Errorf("unfinished = %v %v, want none", u, err)
	}
}

// TestClearedKeepsLateDeliveriesInert: a Cleared settlement of an
// acknowledged message without state creates nothing, and a late claim
// is inert all the same.
func TestClearedKeepsLateDeliveriesInert(t *testing.T) {
	e := newEnv(t, "")
	e.ack(t, e.key)
	if err := apply(t.Context(), e.s, invocation.Settlement{Key: e.key, Cleared: true, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if got := mustClaim(t, e, time.Minute, 5); got.Status != invocation.Terminal {
		t.Errorf("claim = %v, want terminal", got.Status)
	}
	if hash, pttl := e.state(t); len(hash) != 0 || pttl != -2 {
		t.Errorf("hash %v (PTTL %d), want none", hash, pttl)
	}
}

func TestGet(t *testing.T) {
	e := newEnv(t, "")
	got, err := e.s.Get(t.Context(), e.key)
	if err != nil || len(got) != 0 {
		t.Fatalf("get of a missing key = %v %v, want empty", got, err)
	}
	c := mustClaim(t, e, time.Minute, 5)
	if err := apply(t.Context(), e.s, one(invocation.Finish, c.Lease)); err != nil {
		t.Fatal(err)
	}
	got, err = e.s.Get(t.Context(), e.key)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{testField: "ok"}, got); diff != "" {
		t.Errorf("get (-want +got):\n%s", diff)
	}
}

// TestInvalidArguments: malformed claims and settlements are refused with
// an error of their own, neither ErrStale nor ErrTerminal, before
// anything is written or acknowledged.
func TestInvalidArguments(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	good := e.lease(1, "tok")
	bad := func(f func(l *invocation.Lease)) invocation.Lease { l := good; f(&l); return l }
	claimErr := func(f func(r *invocation.ClaimRequest)) error {
		r := e.req(time.Minute, 5)
		f(&r)
		_, err := claimOne(ctx, e.s, r)
		return err
	}
	retry := one(invocation.Retry, good)
	retry.Transitions[0].Backoff = -time.Millisecond
	for name, err := range map[string]error{
		"claim empty field":      claimErr(func(r *invocation.ClaimRequest) { r.Field = "" }),
		"claim reserved field":   claimErr(func(r *invocation.ClaimRequest) { r.Field = terminalField }),
		"claim zero lease":       claimErr(func(r *invocation.ClaimRequest) { r.Lease = 0 }),
		"claim sub-ms lease":     claimErr(func(r *invocation.ClaimRequest) { r.Lease = time.Microsecond }),
		"claim zero max":         claimErr(func(r *invocation.ClaimRequest) { r.MaxAttempts = 0 }),
		"claim reserved record":  claimErr(func(r *invocation.ClaimRequest) { r.Record.Fields = []string{"__x"} }),
		"claim record of itself": claimErr(func(r *invocation.ClaimRequest) { r.Record.Fields = []string{testField} }),
		"probe zero max":         claimErr(func(r *invocation.ClaimRequest) { r.Probe, r.MaxAttempts = true, 0 }),
		"finish zero lease":      apply(ctx, e.s, invocation.Settlement{Key: e.key, Transitions: []invocation.Transition{{Kind: invocation.Finish}}}),
		"finish attempt 0":       apply(ctx, e.s, one(invocation.Finish, bad(func(l *invocation.Lease) { l.Attempt = 0 }))),
		"finish empty token":     apply(ctx, e.s, one(invocation.Finish, bad(func(l *invocation.Lease) { l.Token = "" }))),
		"finish token with ':'":  apply(ctx, e.s, one(invocation.Finish, bad(func(l *invocation.Lease) { l.Token = "a:b" }))),
		"finish reserved field":  apply(ctx, e.s, one(invocation.Finish, bad(func(l *invocation.Lease) { l.Field = "__x" }))),
		"retry backoff":          apply(ctx, e.s, retry),
		"cleared negative ttl":   apply(ctx, e.s, invocation.Settlement{Key: e.key, Cleared: true, Retention: -time.Millisecond}),
		"cleared while pending":  apply(ctx, e.s, invocation.Settlement{Key: e.key, Cleared: true, Retention: time.Hour}),
		"ack sub-ms retention":   apply(ctx, e.s, invocation.Settlement{Key: e.key, Ack: true, Retention: time.Microsecond}),
	} {
		if err == nil || errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal) {
			t.Errorf("%s: %v, want a validation error", name, err)
		}
	}
	if _, pttl := e.state(t); pttl != -2 {
		t.Errorf("invalid calls wrote the key (PTTL %d)", pttl)
	}
	if pending(t, e.c, e.key) != 1 {
		t.Errorf("invalid calls acknowledged the message")
	}

	bt := New(e.c, WithTokenSource(func() string { return "a:b" }))
	if _, err := claimOne(ctx, bt, e.req(time.Minute, 5)); err == nil {
		t.Error("claim with a token containing ':' succeeded")
	}
}

// TestSettlementCheck: Settlement.Check refuses what no StateStore
// applies, naming the culprit, and Settle refuses it the same way without
// writing or acknowledging anything, beside a valid settlement of the
// same batch that applies.
func TestSettlementCheck(t *testing.T) {
	key := invocation.Key{Stream: "s", Group: "g", MessageID: "1-1"}
	l := func(field string) invocation.Lease {
		return invocation.Lease{Key: key, Field: field, Attempt: 1, Token: "tok"}
	}
	tr := func(kind invocation.TransitionKind, field string) invocation.Transition {
		t := invocation.Transition{Kind: kind, Lease: l(field)}
		if kind == invocation.Exhaust || kind == invocation.DeadLetter {
			t.Entry = entryOf(t.Lease)
		}
		return t
	}
	otherKey := key
	otherKey.MessageID = "1-2"
	for _, tc := range []struct {
		name string
		s    invocation.Settlement
		want string // a substring of the error; "" for none
	}{
		{name: "finish", s: invocation.Settlement{Key: key, Transitions: []invocation.Transition{tr(invocation.Finish, "a/h")}}},
		{name: "every kind", s: invocation.Settlement{Key: key, Transitions: []invocation.Transition{
			tr(invocation.Finish, "a/h"), tr(invocation.Retry, "b/h"), tr(invocation.Exhaust, "c/h"), tr(invocation.DeadLetter, "d/h"), tr(invocation.Release, "e/h")}}},
		{name: "ack with terminal transitions", s: invocation.Settlement{Key: key, Ack: true, Retention: time.Hour, Transitions: []invocation.Transition{
			tr(invocation.Finish, "a/h"), tr(invocation.Exhaust, "c/h"), tr(invocation.DeadLetter, "d/h")}}},
		{name: "ack alone", s: invocation.Settlement{Key: key, Ack: true}},
		{name: "stateless ack", s: invocation.Settlement{Key: key, Ack: true, Stateless: true}},
		{name: "cleared", s: invocation.Settlement{Key: key, Cleared: true, Retention: time.Hour}},
		{name: "nothing", s: invocation.Settlement{Key: key}},
		{name: "zero retry backoff", s: invocation.Settlement{Key: key, Transitions: []invocation.Transition{{Kind: invocation.Retry, Lease: l("a/h")}}}},

		{name: "exhaust without an entry", want: "exhaust a/h: no dead-letter entry",
			s: invocation.Settlement{Key: key, Transitions: []invocation.Transition{{Kind: invocation.Exhaust, Lease: l("a/h")}}}},
		{name: "dead-letter without an entry", want: "dead-letter a/h: no dead-letter entry",
			s: invocation.Settlement{Key: key, Transitions: []invocation.Transition{{Kind: invocation.DeadLetter, Lease: l("a/h")}}}},
		{name: "retry in an ack", want: "retry a/h: a settlement that acknowledges",
			s: invocation.Settlement{Key: key, Ack: true, Transitions: []invocation.Transition{tr(invocation.Finish, "b/h"), tr(invocation.Retry, "a/h")}}},
		{name: "release in an ack", want: "release a/h: a settlement that acknowledges",
			s: invocation.Settlement{Key: key, Ack: true, Transitions: []invocation.Transition{tr(invocation.Release, "a/h")}}},
		{name: "lease of another message", want: "finish a/h: the lease is of message 1-2, not",
			s: invocation.Settlement{Key: key, Transitions: []invocation.Transition{{Kind: invocation.Finish, Lease: invocation.Lease{Key: otherKey, Field: "a/h", Attempt: 1, Token: "tok"}}}}},
		{name: "lease of another group", want: "the lease is of message",
			s: invocation.Settlement{Key: key, Transitions: []invocation.Transition{{Kind: invocation.Finish, Lease: invocation.Lease{Key: invocation.Key{Stream: "s", Group: "h", MessageID: "1-1"}, Field: "a/h", Attempt: 1, Token: "tok"}}}}},
		{name: "duplicate field", want: "finish a/h: a settlement writes an invocation once",
			s: invocation.Settlement{Key: key, Transitions: []invocation.Transition{tr(invocation.Retry, "a/h"), tr(invocation.Finish, "a/h")}}},
		{name: "negative backoff", want: "backoff -1ms: must be >= 0",
			s: invocation.Settlement{Key: key, Transitions: []invocation.Transition{{Kind: invocation.Retry, Lease: l("a/h"), Backoff: -time.Millisecond}}}},
		{name: "unknown kind", want: "unknown transition TransitionKind(9)",
			s: invocation.Settlement{Key: key, Transitions: []invocation.Transition{{Kind: 9, Lease: l("a/h")}}}},
		{name: "zero kind", want: "unknown transition TransitionKind(0)",
			s: invocation.Settlement{Key: key, Transitions: []invocation.Transition{{Lease: l("a/h")}}}},
		{name: "malformed lease", want: "finish: lease attempt 0",
			s: invocation.Settlement{Key: key, Transitions: []invocation.Transition{{Kind: invocation.Finish, Lease: invocation.Lease{Key: key, Field: "a/h", Token: "tok"}}}}},
		{name: "negative retention", want: "retention -1s",
			s: invocation.Settlement{Key: key, Ack: true, Retention: -time.Second}},
		{name: "cleared with ack", want: "a Cleared settlement has no Ack",
			s: invocation.Settlement{Key: key, Cleared: true, Ack: true}},
		{name: "cleared with a transition", want: "a Cleared settlement has no Ack and no transitions",
			s: invocation.Settlement{Key: key, Cleared: true, Transitions: []invocation.Transition{tr(invocation.Finish, "a/h")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.s.Check()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check = %v, want an error containing %q", err, tc.want)
			}
			// The Store refuses it alike, beside a valid settlement that
			// applies, and writes nothing of it.
			e := newEnv(t, "")
			now := e.nowMS(t)
			seed := map[string]string{}
			s := tc.s
			s.Key = e.key
			s.Transitions = slices.Clone(s.Transitions)
			for i, tr := range s.Transitions {
				if tr.Lease.Key == key {
					tr.Lease.Key = e.key
				}
				if tr.Kind == invocation.Exhaust || tr.Kind == invocation.DeadLetter || tr.Kind == 0 || tr.Kind > invocation.Release {
					seed[tr.Lease.Field] = exhausted(tr.Lease.Attempt, tr.Lease.Token)
				} else {
					seed[tr.Lease.Field] = running(now+hourMS, tr.Lease.Attempt, tr.Lease.Token)
				}
				s.Transitions[i] = tr
			}
			e.seed(t, seed, 0)
			fine := invocation.Lease{Key: e.other, Field: testField, Attempt: 1, Token: "fine"}
			(&env{c: e.c, hash: hashOf(e.other)}).seed(t, map[string]string{testField: running(now+hourMS, 1, "fine")}, 0)
			rs := e.s.Settle(t.Context(), []invocation.Settlement{s, acked(one(invocation.Finish, fine), time.Hour)})
			if err := rs[0].Err; err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal) {
				t.Errorf("Settle = %v, want an error containing %q", err, tc.want)
			}
			if rs[1].Err != nil {
				t.Errorf("Settle of the valid settlement beside it = %v", rs[1].Err)
			}
			got, pttl := e.state(t)
			if diff := cmp.Diff(seed, got, cmpopts.EquateEmpty()); diff != "" || pttl > 0 {
				t.Errorf("hash after a refused settlement (PTTL %d; -want +got):\n%s", pttl, diff)
			}
			if pending(t, e.c, e.key) != 1 || pending(t, e.c, e.other) != 0 {
				t.Errorf("pending: refused message %d, valid one %d; want 1 and 0", pending(t, e.c, e.key), pending(t, e.c, e.other))
			}
			if got := dlqEntries(t, e.c, e.key.Stream); len(got) != 0 {
				t.Errorf("a refused settlement wrote dead-letter entries %v", got)
			}
		})
	}
}

// TestUnknownReplyCode: a script reply that is not one of the codes of
// claim.lua or settle.lua, or not a reply of their shape, fails the claim
// or the settlement with an error that is neither ErrStale nor
// ErrTerminal, rather than being read as an outcome.
func TestUnknownReplyCode(t *testing.T) {
	e := newEnv(t, "")
	retry := one(invocation.Retry, e.lease(1, "tok"))
	for _, src := range []string{
		"return {99}", "return {0}", "return {12}", "return {}", "return 'x'", "return {'x'}",
		"return {1}",      // claimed takes 5 elements, applied 1 + 1 transition
		"return {1, 'x'}", // neither claimed nor the next time of a retry
		"return {11, 1}",  // probed takes 3; settle.lua has no code 11
		"return {4, 4}",   // succeeded takes 1, leaving one; settle.lua has no code 4
	} {
		t.Run(src, func(t *testing.T) {
			exec := func() rueidis.RedisResult { return rueidis.NewLuaScript(src).Exec(t.Context(), e.c, nil, nil) }
			c := claimResult(splitReplies(exec(), 1, claimReplyLen)[0], e.req(time.Minute, 5), "tok")
			if err := c.Err; err == nil || errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal) {
				t.Errorf("claim: %+v, want an error", c)
			}
			items := []settleItem{{n: len(retry.Transitions)}}
			r := settleResultOf(retry, splitReplies(exec(), 1, settleReplyLen(items))[0])
			if err := r.Err; err == nil || errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal) {
				t.Errorf("settle: %+v, want an error", r)
			}
		})
	}
}

var hexToken = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestRandomToken(t *testing.T) {
	a, b := randomToken(), randomToken()
	if !hexToken.MatchString(a) || a == b {
		t.Errorf("tokens %q, %q: want distinct 32-digit hex", a, b)
	}
}

func mustClaim(t *testing.T, e *env, lease time.Duration, maxAttempts int) invocation.Claim {
	t.Helper()
	c, err := claimOne(t.Context(), e.s, e.req(lease, maxAttempts))
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return c
}

// claimWhenNotRunning polls Claim until the running lease has expired.
func claimWhenNotRunning(t *testing.T, e *env, lease time.Duration, maxAttempts int) invocation.Claim {
	t.Helper()
	var c invocation.Claim
	testutil.WaitFor(t, 5*time.Second, "the running lease to expire", func() bool {
		c = mustClaim(t, e, lease, maxAttempts)
		return c.Status != invocation.Running
	})
	return c
}

func TestPinFirstWriterWins(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	const field = "__schedule"
	var wg sync.WaitGroup
	got := make([]string, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := e.s.Pin(ctx, e.key, field, "v"+string(rune('a'+i)))
			if err != nil {
				t.Error(err)
			}
			got[i] = v
		}()
	}
	wg.Wait()
	for _, v := range got[1:] {
		if v != got[0] {
			t.Fatalf("pins disagree: %q", got)
		}
	}
	hash, pttl := e.state(t)
	if diff := cmp.Diff(map[string]string{field: got[0]}, hash); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
	checkPTTL(t, ttlNone, pttl)
	if v, err := e.s.Pin(ctx, e.key, field, "later"); err != nil || v != got[0] {
		t.Errorf("pin after the first = %q %v, want %q", v, err, got[0])
	}

	if err := apply(ctx, e.s, invocation.Settlement{Key: e.key, Ack: true, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Pin(ctx, e.key, "__other", "x"); !errors.Is(err, invocation.ErrTerminal) {
		t.Errorf("pin on a retained hash: %v, want ErrTerminal", err)
	}
	for _, bad := range []string{"app/handler", "__terminal", "__", "", invocation.TraceField("app/handler")} {
		if _, err := e.s.Pin(ctx, e.key, bad, "x"); err == nil {
			t.Errorf("pin of field %q succeeded", bad)
		}
	}
}

// TestTraceLineageFollowsAttempts walks one invocation through a released
// attempt, a failed one and an exhausted one, and checks that each Claim
// returns the trace the attempt before it stored, which is what the Engine
// links a retry's span to (docs/observability.md#spans).
func TestTraceLineageFollowsAttempts(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	const lease = time.Minute
	claimed := func(wantAttempt int, wantPrev string) invocation.Lease {
		t.Helper()
		c, err := claimOne(ctx, e.s, e.req(lease, 2))
		if err != nil {
			t.Fatal(err)
		}
		if c.Status != invocation.Claimed || c.Lease.Attempt != wantAttempt || c.PrevTrace != wantPrev {
			t.Fatalf("claim = %v attempt %d prev %q, want claimed attempt %d prev %q",
				c.Status, c.Lease.Attempt, c.PrevTrace, wantAttempt, wantPrev)
		}
		return c.Lease
	}
	const given, failed, last = "trace-released", "trace-failed", "trace-last"

	l := claimed(1, "")
	l.Trace = given
	if err := apply(ctx, e.s, one(invocation.Release, l)); err != nil {
		t.Fatal(err)
	}
	l = claimed(1, given)
	l.Trace = failed
	if err := apply(ctx, e.s, one(invocation.Retry, l)); err != nil {
		t.Fatal(err)
	}
	l = claimed(2, failed)
	l.Trace = last
	if err := apply(ctx, e.s, one(invocation.Exhaust, l)); err != nil {
		t.Fatal(err)
	}
	c, err := claimOne(ctx, e.s, e.req(lease, 2))
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != invocation.DeadLettered || c.PrevTrace != last {
		t.Fatalf("claim after exhaust = %v prev %q, want dead-lettered prev %q", c.Status, c.PrevTrace, last)
	}
	// The dead-letter entry carries the last attempt's lineage.
	if _, got := withoutIDs(dlqEntries(t, e.c, e.key.Stream)); len(got) != 1 || got[0].Trace != last {
		t.Errorf("dead-letter entries %+v, want one with trace %q", got, last)
	}
	if err := apply(ctx, e.s, invocation.Settlement{Key: e.key, Ack: true, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	hash, _ := e.state(t)
	want := map[string]string{testField: dead(2, l.Token), invocation.TraceField(testField): last, terminalField: "1"}
	if diff := cmp.Diff(want, hash); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
}
