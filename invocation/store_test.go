package invocation

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/testutil"
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

func TestClaimExpiredLeaseClaimsNextAttempt(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	first := mustClaim(t, e, 10*time.Millisecond, 5)
	if first.Status != Claimed || first.Lease.Attempt != 1 {
		t.Fatalf("first claim = %+v, want attempt 1 claimed", first)
	}
	next := claimWhenNotRunning(t, e, 10*time.Millisecond, 5)
	if next.Status != Claimed || next.Lease.Attempt != 2 || next.Lease.Token == first.Lease.Token {
		t.Fatalf("claim after expiry = %+v, want attempt 2 with a new token", next)
	}
	// The owner of the expired lease comes back: every transition is stale.
	old := first.Lease
	for name, err := range map[string]error{
		"finish":   e.s.Finish(ctx, old),
		"release":  e.s.Release(ctx, old),
		"exhaust":  e.s.Exhaust(ctx, old),
		"mark_dlq": e.s.MarkDLQ(ctx, old),
	} {
		if !errors.Is(err, ErrStale) {
			t.Errorf("%s with the expired lease: %v, want ErrStale", name, err)
		}
	}
	if _, err := e.s.ScheduleRetry(ctx, old, 0); !errors.Is(err, ErrStale) {
		t.Errorf("schedule_retry with the expired lease: %v, want ErrStale", err)
	}
	if err := e.s.Finish(ctx, next.Lease); err != nil {
		t.Fatalf("finish the new attempt: %v", err)
	}
	if got := mustClaim(t, e, time.Minute, 5); got.Status != Succeeded {
		t.Errorf("claim after finish = %v, want succeeded", got.Status)
	}
}

func TestClaimExpiredLeaseAtMaxAttemptsExhausts(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	first := mustClaim(t, e, 10*time.Millisecond, 1)
	got := claimWhenNotRunning(t, e, 10*time.Millisecond, 1)
	if got.Status != Exhausted || got.Lease.Attempt != 1 || got.Lease.Token == first.Lease.Token {
		t.Fatalf("claim after expiry of the last attempt = %+v, want exhausted at attempt 1 with a new token", got)
	}
	if err := e.s.Exhaust(ctx, first.Lease); !errors.Is(err, ErrStale) {
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
	if err := e.s.MarkDLQ(ctx, got.Lease); err != nil {
		t.Fatalf("mark_dlq: %v", err)
	}
	if c := mustClaim(t, e, time.Minute, 1); c.Status != DeadLettered || c.Lease.Attempt != 1 {
		t.Errorf("claim after mark_dlq = %+v, want dead-lettered", c)
	}
}

func TestClaimRetryFlow(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	c := mustClaim(t, e, time.Minute, 3)
	at, err := e.s.ScheduleRetry(ctx, c.Lease, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if nd := mustClaim(t, e, time.Minute, 3); nd.Status != NotDue || !nd.NextAttemptAt.Equal(at) {
		t.Fatalf("claim before the retry = %+v, want not due at %v", nd, at)
	}

	// Seed a retry that is due (in the past): the next attempt is claimed.
	e.seed(t, map[string]string{testField: nextAt(e.nowMS(t)-1, 1, c.Lease.Token)}, 0)
	c2 := mustClaim(t, e, time.Minute, 3)
	if c2.Status != Claimed || c2.Lease.Attempt != 2 {
		t.Fatalf("claim of a due retry = %+v, want attempt 2", c2)
	}

	// A short backoff passes: polled, not slept.
	if _, err := e.s.ScheduleRetry(ctx, c2.Lease, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	var c3 Claim
	testutil.WaitFor(t, 5*time.Second, "the retry to become due", func() bool {
		c3 = mustClaim(t, e, time.Minute, 3)
		return c3.Status != NotDue
	})
	if c3.Status != Claimed || c3.Lease.Attempt != 3 {
		t.Fatalf("claim of the third attempt = %+v", c3)
	}
	if err := e.s.Exhaust(ctx, c3.Lease); err != nil {
		t.Fatal(err)
	}
	ex := mustClaim(t, e, time.Minute, 3)
	if ex.Status != Exhausted || ex.Lease.Attempt != 3 || ex.Lease.Token != c3.Lease.Token {
		t.Fatalf("claim after exhaust = %+v", ex)
	}
	for range 2 { // idempotent
		if err := e.s.MarkDLQ(ctx, ex.Lease); err != nil {
			t.Fatalf("mark_dlq: %v", err)
		}
	}
	e.ack(t, e.key)
	if err := e.s.Retain(ctx, e.key, DefaultRetention); err != nil {
		t.Fatal(err)
	}
	hash, pttl := e.state(t)
	want := map[string]string{testField: dead(3, c3.Lease.Token), terminalField: "1"}
	if diff := cmp.Diff(want, hash); diff != "" {
		t.Errorf("final hash (-want +got):\n%s", diff)
	}
	checkPTTL(t, DefaultRetention, pttl)
}

func TestReleaseDoesNotChargeTheAttempt(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	c := mustClaim(t, e, time.Minute, 2)
	if err := e.s.Release(ctx, c.Lease); err != nil {
		t.Fatal(err)
	}
	c = mustClaim(t, e, time.Minute, 2)
	if c.Status != Claimed || c.Lease.Attempt != 1 {
		t.Fatalf("claim after releasing attempt 1 = %+v, want attempt 1", c)
	}
	if _, err := e.s.ScheduleRetry(ctx, c.Lease, 0); err != nil {
		t.Fatal(err)
	}
	c = mustClaim(t, e, time.Minute, 2)
	if c.Status != Claimed || c.Lease.Attempt != 2 {
		t.Fatalf("claim after a failed attempt 1 = %+v, want attempt 2", c)
	}
	if err := e.s.Release(ctx, c.Lease); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Release(ctx, c.Lease); !errors.Is(err, ErrStale) {
		t.Errorf("second release: %v, want ErrStale", err)
	}
	c = mustClaim(t, e, time.Minute, 2)
	if c.Status != Claimed || c.Lease.Attempt != 2 {
		t.Fatalf("claim after releasing the last attempt = %+v, want attempt 2 again", c)
	}
}

func TestClaimConcurrent(t *testing.T) {
	e := newEnv(t, "")
	const n = 50
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		counts = map[Status]int{}
		errs   []error
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			c, err := e.s.Claim(t.Context(), e.key, testField, time.Minute, 5, Record{})
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
	if diff := cmp.Diff(map[Status]int{Claimed: 1, Running: n - 1}, counts); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
}

// TestStaleDeliveryAfterAckIsInert: a delivery that claimed before another
// worker acknowledged the message, and held its lease in memory, changes
// nothing afterwards, with any retention: its transitions and new claims
// are refused, nothing runs, and no state reappears, whether the ack path
// retained the hash (retention on) or deleted it (retention 0).
func TestStaleDeliveryAfterAckIsInert(t *testing.T) {
	for _, retention := range []time.Duration{0, time.Hour} {
		t.Run(fmt.Sprintf("retention %v", retention), func(t *testing.T) {
			e := newEnv(t, "")
			ctx := t.Context()
			c := mustClaim(t, e, time.Minute, 5)
			e.seed(t, map[string]string{"ex/handler": exhausted(2, "tok")}, 0)
			// Another worker settles the message.
			if ackErr, retainErr := e.s.Settle(ctx, e.key, retention); ackErr != nil || retainErr != nil {
				t.Fatalf("settle: %v %v", ackErr, retainErr)
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
		})
	}
}

// checkStaleInert runs every transition of a stale delivery holding lease
// l of e.key after its message left the PEL, and expects each refused.
func checkStaleInert(t *testing.T, e *env, l Lease, retention time.Duration) {
	t.Helper()
	ctx := t.Context()
	for _, f := range []string{l.Field, "new/handler"} {
		if got, err := e.s.Claim(ctx, e.key, f, time.Minute, 5, Record{}); err != nil || got.Status != Terminal {
			t.Errorf("claim of %s = %v %v, want terminal", f, got.Status, err)
		}
	}
	// A first delivery's claim records the message's other invocations:
	// after the ack it records nothing.
	rec := Record{Fields: []string{"other/handler"}, Complete: true}
	if got, err := e.s.Claim(ctx, e.key, "late/handler", time.Minute, 5, rec); err != nil || got.Status != Terminal {
		t.Errorf("recording claim = %v %v, want terminal", got.Status, err)
	}
	exLease := Lease{Key: e.key, Field: "ex/handler", Attempt: 2, Token: "tok"}
	_, retryErr := e.s.ScheduleRetry(ctx, l, time.Second)
	_, pinErr := e.s.Pin(ctx, e.key, "__schedule", "late")
	for name, err := range map[string]error{
		"release":        e.s.Release(ctx, l),
		"finish":         e.s.Finish(ctx, l),
		"finish_settle":  e.s.FinishSettle(ctx, l, retention),
		"schedule_retry": retryErr,
		"exhaust":        e.s.Exhaust(ctx, l),
		"mark_dlq":       e.s.MarkDLQ(ctx, exLease),
		"pin":            pinErr,
	} {
		if !errors.Is(err, ErrTerminal) {
			t.Errorf("%s: %v, want ErrTerminal", name, err)
		}
	}
	if ackErr, retainErr := e.s.Settle(ctx, e.key, 7*24*time.Hour); ackErr != nil || retainErr != nil {
		t.Errorf("settle again: %v %v", ackErr, retainErr)
	}
	if err := e.s.Retain(ctx, e.key, 7*24*time.Hour); err != nil {
		t.Errorf("retain again: %v", err)
	}
	if u, err := e.s.Unfinished(ctx, e.key); err != nil || len(u.Fields) != 0 {
		t.Errorf("unfinished = %v %v, want none", u, err)
	}
}

// TestRetainKeepsLateDeliveriesInert: Retain of an acknowledged message
// without state creates nothing, and a late claim is inert all the same.
func TestRetainKeepsLateDeliveriesInert(t *testing.T) {
	e := newEnv(t, "")
	e.ack(t, e.key)
	if err := e.s.Retain(t.Context(), e.key, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := mustClaim(t, e, time.Minute, 5); got.Status != Terminal {
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
	if err := e.s.Finish(t.Context(), c.Lease); err != nil {
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

func TestInvalidArguments(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	good := e.lease(1, "tok")
	bad := func(f func(l *Lease)) Lease { l := good; f(&l); return l }
	_, retryErr := e.s.ScheduleRetry(ctx, good, -time.Millisecond)
	claimErr := func(field string, lease time.Duration, max int) error {
		_, err := e.s.Claim(ctx, e.key, field, lease, max, Record{})
		return err
	}
	for name, err := range map[string]error{
		"claim empty field":      claimErr("", time.Minute, 5),
		"claim reserved field":   claimErr(terminalField, time.Minute, 5),
		"claim zero lease":       claimErr(testField, 0, 5),
		"claim sub-ms lease":     claimErr(testField, time.Microsecond, 5),
		"claim zero max":         claimErr(testField, time.Minute, 0),
		"finish zero lease":      e.s.Finish(ctx, Lease{}),
		"finish attempt 0":       e.s.Finish(ctx, bad(func(l *Lease) { l.Attempt = 0 })),
		"finish empty token":     e.s.Finish(ctx, bad(func(l *Lease) { l.Token = "" })),
		"finish token with ':'":  e.s.Finish(ctx, bad(func(l *Lease) { l.Token = "a:b" })),
		"finish reserved field":  e.s.Finish(ctx, bad(func(l *Lease) { l.Field = "__x" })),
		"schedule_retry backoff": retryErr,
		"retain negative ttl":    e.s.Retain(ctx, e.key, -time.Millisecond),
		"retain while pending":   e.s.Retain(ctx, e.key, time.Hour),
	} {
		if err == nil || errors.Is(err, ErrStale) || errors.Is(err, ErrTerminal) {
			t.Errorf("%s: %v, want a validation error", name, err)
		}
	}
	if _, pttl := e.state(t); pttl != -2 {
		t.Errorf("invalid calls wrote the key (PTTL %d)", pttl)
	}

	bt := New(e.c, WithTokenSource(func() string { return "a:b" }))
	if _, err := bt.Claim(ctx, e.key, testField, time.Minute, 5, Record{}); err == nil {
		t.Error("claim with a token containing ':' succeeded")
	}
}

func TestUnknownReplyCode(t *testing.T) {
	e := newEnv(t, "")
	for _, src := range []string{"return {99}", "return {}", "return 'x'"} {
		_, err := e.s.transition(t.Context(), "test", rueidis.NewLuaScript(src), e.lease(1, "tok"))
		if err == nil || errors.Is(err, ErrStale) || errors.Is(err, ErrTerminal) {
			t.Errorf("%q: %v, want an error", src, err)
		}
	}
}

var hexToken = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestRandomToken(t *testing.T) {
	a, b := randomToken(), randomToken()
	if !hexToken.MatchString(a) || a == b {
		t.Errorf("tokens %q, %q: want distinct 32-digit hex", a, b)
	}
}

func mustClaim(t *testing.T, e *env, lease time.Duration, maxAttempts int) Claim {
	t.Helper()
	c, err := e.s.Claim(t.Context(), e.key, testField, lease, maxAttempts, Record{})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return c
}

// claimWhenNotRunning polls Claim until the running lease has expired.
func claimWhenNotRunning(t *testing.T, e *env, lease time.Duration, maxAttempts int) Claim {
	t.Helper()
	var c Claim
	testutil.WaitFor(t, 5*time.Second, "the running lease to expire", func() bool {
		c = mustClaim(t, e, lease, maxAttempts)
		return c.Status != Running
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

	e.ack(t, e.key)
	if err := e.s.Retain(ctx, e.key, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Pin(ctx, e.key, "__other", "x"); !errors.Is(err, ErrTerminal) {
		t.Errorf("pin on a retained hash: %v, want ErrTerminal", err)
	}
	for _, bad := range []string{"app/handler", "__terminal", "__", "", TraceField("app/handler")} {
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
	claimed := func(wantAttempt int, wantPrev string) Lease {
		t.Helper()
		c, err := e.s.Claim(ctx, e.key, testField, lease, 2, Record{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status != Claimed || c.Lease.Attempt != wantAttempt || c.PrevTrace != wantPrev {
			t.Fatalf("claim = %v attempt %d prev %q, want claimed attempt %d prev %q",
				c.Status, c.Lease.Attempt, c.PrevTrace, wantAttempt, wantPrev)
		}
		return c.Lease
	}
	const given, failed, last = "trace-released", "trace-failed", "trace-last"

	l := claimed(1, "")
	l.Trace = given
	if err := e.s.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	l = claimed(1, given)
	l.Trace = failed
	if _, err := e.s.ScheduleRetry(ctx, l, 0); err != nil {
		t.Fatal(err)
	}
	l = claimed(2, failed)
	l.Trace = last
	if err := e.s.Exhaust(ctx, l); err != nil {
		t.Fatal(err)
	}
	c, err := e.s.Claim(ctx, e.key, testField, lease, 2, Record{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != Exhausted || c.PrevTrace != last {
		t.Fatalf("claim after exhaust = %v prev %q, want exhausted prev %q", c.Status, c.PrevTrace, last)
	}
	if err := e.s.MarkDLQ(ctx, c.Lease); err != nil {
		t.Fatal(err)
	}
	e.ack(t, e.key)
	if err := e.s.Retain(ctx, e.key, time.Hour); err != nil {
		t.Fatal(err)
	}
	hash, _ := e.state(t)
	want := map[string]string{testField: dead(2, l.Token), TraceField(testField): last, terminalField: "1"}
	if diff := cmp.Diff(want, hash); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
}
