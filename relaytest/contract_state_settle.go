package relaytest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/invocation"
)

// Cases of TestStateStore about what one settlement writes: the dead-letter
// entries of Exhaust and DeadLetter, written once, with their marker and
// their id in invocation.DLQField; a settlement applied whole or not at
// all; the acknowledgement and the retention it applies, a stateless ack;
// and a batch of settlements and claims answered item by item.

// stateExhaustWritesTheDeadLetter: Exhaust ends the last attempt, writes
// its entry and marks it, in one step: the next claim finds the invocation
// dead-lettered, with the lease's attempt and token, and no transition
// with the lease but another Exhaust or DeadLetter (which write nothing
// more) applies.
func stateExhaustWritesTheDeadLetter(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 1)
	id := s.exhaust(t, c.Lease)
	entries := s.h.DeadLetters(t, s.key)
	if len(entries) != 1 || entries[0].ID != id || entries[0].OriginalID != s.key.MessageID || entries[0].Handler != "handler" {
		t.Fatalf("dead letters = %+v, want one entry of %s with id %s", entries, s.key.MessageID, id)
	}
	dl := s.claim(t, field, time.Hour, 1)
	if dl.Status != invocation.DeadLettered || dl.Lease.Attempt != 1 || dl.Lease.Token != c.Lease.Token {
		t.Fatalf("claim after exhaust = %+v, want dead-lettered with the lease's attempt and token", dl)
	}
	if got := s.h.State(t, s.key)[invocation.DLQField(field)]; got != id {
		t.Errorf("%s = %q, want the entry's id %s", invocation.DLQField(field), got, id)
	}
	for _, tr := range []invocation.Transition{finish(c.Lease), retry(c.Lease, 0), release(c.Lease)} {
		s.wantErr(t, tr.Kind.String()+" after exhaust", invocation.ErrStale, s.transit(t, tr).Err)
	}
	wrong := c.Lease
	wrong.Token += "x"
	s.wantErr(t, "dead-letter with another token", invocation.ErrStale, s.transit(t, markDead(wrong)).Err)
	s.wantErr(t, "exhaust with another token", invocation.ErrStale, s.transit(t, exhaust(wrong)).Err)
	if n := len(s.h.DeadLetters(t, s.key)); n != 1 {
		t.Errorf("%d dead-letter entries after the refused transitions, want 1", n)
	}
}

// stateDeadLetterNeedsExhausted: DeadLetter is for an invocation a claim
// found exhausted; on a running attempt it is stale and writes nothing.
func stateDeadLetterNeedsExhausted(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 1)
	s.wantErr(t, "dead-letter of a running attempt", invocation.ErrStale, s.transit(t, markDead(c.Lease)).Err)
	if got := s.claim(t, field, time.Hour, 1); got.Status != invocation.Running {
		t.Errorf("claim after a refused dead-letter = %+v, want still running", got)
	}
	if got := s.h.DeadLetters(t, s.key); len(got) != 0 {
		t.Errorf("a refused dead-letter wrote %+v", got)
	}
}

// stateDeadLetterWrittenOnce: an Exhaust or DeadLetter applied again (a
// retry after a lost reply, or two deliveries that found the same
// exhausted attempt) applies and writes no second entry: its result has
// no id, and the first entry's id stays in invocation.DLQField.
func stateDeadLetterWrittenOnce(t *testing.T, s *stateSuite) {
	// field: exhausted by its last attempt's failure.
	c := s.claim(t, field, time.Hour, 1)
	first := s.exhaust(t, c.Lease)
	// otherField: exhausted by a claim, then dead-lettered.
	s.retry(t, s.claim(t, otherField, time.Hour, 1).Lease, 0)
	ex := s.claim(t, otherField, time.Hour, 1)
	if ex.Status != invocation.Exhausted {
		t.Fatalf("claim beyond max attempts = %+v, want exhausted", ex)
	}
	second := s.markDead(t, ex.Lease)
	if first == "" || second == "" || first == second {
		t.Fatalf("entry ids %q and %q, want two distinct ids", first, second)
	}
	for _, c := range []struct {
		name string
		t    invocation.Transition
	}{
		{"exhaust again", exhaust(c.Lease)},
		{"dead-letter after exhaust", markDead(c.Lease)},
		{"dead-letter again", markDead(ex.Lease)},
		{"exhaust after dead-letter", exhaust(ex.Lease)},
	} {
		r := s.transit(t, c.t)
		if r.Err != nil || len(r.Transitions) != 1 || r.Transitions[0].DLQID != "" {
			t.Errorf("%s = %+v; want applied, with no new entry", c.name, r)
		}
	}
	// Both at once, with the ack, as a redelivery settles them.
	r := s.settleOne(t, invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{exhaust(c.Lease), markDead(ex.Lease)}, Ack: true, Retention: time.Hour})
	if r.Err != nil || r.Transitions[0].DLQID != "" || r.Transitions[1].DLQID != "" {
		t.Errorf("both again with the ack = %+v; want applied, with no new entry", r)
	}
	var ids []string
	for _, e := range s.h.DeadLetters(t, s.key) {
		ids = append(ids, e.ID)
	}
	if want := []string{first, second}; !slices.Equal(ids, want) {
		t.Errorf("dead letters %v, want %v", ids, want)
	}
	state := s.h.State(t, s.key)
	if state[invocation.DLQField(field)] != first || state[invocation.DLQField(otherField)] != second {
		t.Errorf("state = %v, want %s = %s and %s = %s", state, invocation.DLQField(field), first, invocation.DLQField(otherField), second)
	}
	s.wantPending(t, "after the ack", s.key, false)
}

// stateDeadLetterEntryReadsBack: an entry reads back field for field under
// the id the transition returned (Timestamp in UTC, millisecond
// precision; its ID ignored); an empty OriginalStream is the message's
// stream and a zero Timestamp is filled in; and a malformed-message entry
// (app and handler "-", handler_attempts 0) is one like any other.
func stateDeadLetterEntryReadsBack(t *testing.T, s *stateSuite) {
	full := deadLetter(invocation.Lease{Key: s.key, Field: field, Attempt: 3})
	full.ID = "1-1" // ignored
	full.OriginalStream = s.key.Stream
	full.Event = `{"name":"Ada Lovelace","note":"line 1\nline 2 ü"}`
	full.Trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	full.Deliveries = 4
	full.Timestamp = time.Date(2026, 9, 12, 10, 0, 0, 123456789, time.FixedZone("CEST", 2*3600))
	defaults := deadLetter(invocation.Lease{Key: s.key, Field: otherField, Attempt: 1})
	malformed := deadLetter(invocation.Lease{Key: s.key, Field: "-/-"})
	malformed.App, malformed.Handler, malformed.HandlerAttempts = dlq.MalformedName, dlq.MalformedName, 0
	malformed.Event, malformed.Reason = "{not json", "malformed event: not valid JSON"

	var leases []invocation.Lease
	for _, f := range []string{field, otherField, "-/-"} {
		leases = append(leases, s.claim(t, f, time.Hour, 1).Lease)
	}
	ts := []invocation.Transition{
		{Kind: invocation.Exhaust, Lease: leases[0], Entry: &full},
		{Kind: invocation.Exhaust, Lease: leases[1], Entry: &defaults},
		{Kind: invocation.Exhaust, Lease: leases[2], Entry: &malformed},
	}
	res := s.apply(t, "exhaust with entries", ts...)
	got := s.h.DeadLetters(t, s.key)
	if len(got) != 3 {
		t.Fatalf("dead letters = %+v, want 3", got)
	}
	if stamp := got[1].Timestamp; stamp.IsZero() {
		t.Errorf("an entry without a Timestamp reads back without one: %+v", got[1])
	}
	wantFull := full
	wantFull.Timestamp = full.Timestamp.UTC().Truncate(time.Millisecond)
	wantDefaults := defaults
	wantDefaults.OriginalStream, wantDefaults.Timestamp = s.key.Stream, got[1].Timestamp
	wantMalformed := malformed
	wantMalformed.OriginalStream, wantMalformed.Timestamp = s.key.Stream, got[2].Timestamp
	want := []dlq.Entry{wantFull, wantDefaults, wantMalformed}
	state := s.h.State(t, s.key)
	for i := range want {
		want[i].ID = res[i].DLQID
		if f := invocation.DLQField(leases[i].Field); state[f] != res[i].DLQID {
			t.Errorf("%s = %q, want %q", f, state[f], res[i].DLQID)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
	}
	for _, e := range got {
		if e.Timestamp.Location() != time.UTC {
			t.Errorf("entry %s: Timestamp in %v, want UTC", e.ID, e.Timestamp.Location())
		}
	}
}

// stateInvalidDeadLetterEntriesRefused: an entry dlq.Entry.Validate
// refuses, or one of another stream, is refused with a *dlq.FieldError
// naming the wire field, before anything changes.
func stateInvalidDeadLetterEntriesRefused(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 1)
	for _, tc := range []struct {
		wire string
		edit func(e *dlq.Entry)
	}{
		{"original_stream", func(e *dlq.Entry) { e.OriginalStream = s.key.Stream + ".other" }},
		{"original_id", func(e *dlq.Entry) { e.OriginalID = "not-an-id" }},
		{"group", func(e *dlq.Entry) { e.Group = "" }},
		{"consumer", func(e *dlq.Entry) { e.Consumer = "" }},
		{"reason", func(e *dlq.Entry) { e.Reason = "" }},
		{"handler", func(e *dlq.Entry) { e.App = dlq.MalformedName }},
		{"handler_attempts", func(e *dlq.Entry) { e.HandlerAttempts = -1 }},
	} {
		for _, kind := range []invocation.TransitionKind{invocation.Exhaust, invocation.DeadLetter} {
			e := deadLetter(c.Lease)
			tc.edit(&e)
			r := s.transit(t, invocation.Transition{Kind: kind, Lease: c.Lease, Entry: &e})
			var fe *dlq.FieldError
			switch {
			case r.Err == nil:
				t.Errorf("%s with a bad %s applied, want an error naming it", kind, tc.wire)
			case !errors.Is(r.Err, dlq.ErrInvalidEntry) || !errors.As(r.Err, &fe):
				t.Errorf("%s with a bad %s: %v, want a *dlq.FieldError (dlq.ErrInvalidEntry)", kind, tc.wire, r.Err)
			case fe.Field != tc.wire:
				t.Errorf("%s: %v names field %q, want %q", kind, r.Err, fe.Field, tc.wire)
			}
		}
	}
	if got := s.h.DeadLetters(t, s.key); len(got) != 0 {
		t.Errorf("refused entries were written: %+v", got)
	}
	if got := s.claim(t, field, time.Hour, 1); got.Status != invocation.Running || !got.RunningUntil.Equal(c.Lease.Deadline) {
		t.Errorf("claim after the refused entries = %+v, want still running", got)
	}
}

// stateSettlementIsAtomic: a settlement one of whose transitions is stale
// applies none of them: the transition before it is not written, its
// entry not appended, and its ack not made.
func stateSettlementIsAtomic(t *testing.T, s *stateSuite) {
	a := s.claim(t, field, time.Hour, 1)
	b := s.claim(t, otherField, time.Hour, 3)
	stale := b.Lease
	stale.Token += "x"
	for _, c := range []struct {
		name string
		st   invocation.Settlement
	}{
		{"exhaust, then a stale finish", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{exhaust(a.Lease), finish(stale)}}},
		{"finish, then a stale retry", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{finish(a.Lease), retry(stale, 0)}}},
		{"a stale release first", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{release(stale), finish(a.Lease)}}},
		{"exhaust and a stale finish, with the ack", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{exhaust(a.Lease), finish(stale)}, Ack: true, Retention: time.Hour}},
		{"with the ack at retention 0", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{finish(a.Lease), finish(stale)}, Ack: true}},
	} {
		r := s.settleOne(t, c.st)
		if !errors.Is(r.Err, invocation.ErrStale) || r.Transitions != nil {
			t.Errorf("%s = %+v; want ErrStale and no transition results", c.name, r)
		}
	}
	if got := s.h.DeadLetters(t, s.key); len(got) != 0 {
		t.Errorf("stale settlements wrote entries: %+v", got)
	}
	s.wantPending(t, "after the stale settlements", s.key, true)
	for _, c := range []struct {
		lease invocation.Lease
		f     string
	}{{a.Lease, field}, {b.Lease, otherField}} {
		if got := s.claim(t, c.f, time.Hour, 3); got.Status != invocation.Running || !got.RunningUntil.Equal(c.lease.Deadline) {
			t.Errorf("claim of %s after the stale settlements = %+v, want still running", c.f, got)
		}
	}
	if _, ok := s.h.State(t, s.key)["__terminal"]; ok {
		t.Error("a stale settlement with an ack retained the state")
	}
	// With the right leases it all applies.
	r := s.settleOne(t, invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{exhaust(a.Lease), finish(b.Lease)}, Ack: true, Retention: time.Hour})
	if r.Err != nil || r.Transitions[0].DLQID == "" {
		t.Fatalf("the settlement with the right leases = %+v, want applied with an entry", r)
	}
	s.wantPending(t, "after the settlement", s.key, false)
}

// stateAckRetainsTheState: a settlement with Ack writes its transitions,
// acknowledges the message and retains its state (__terminal, a TTL):
// claims of it are Terminal from then on.
func stateAckRetainsTheState(t *testing.T, s *stateSuite) {
	a := s.claim(t, field, time.Hour, 3)
	if r := s.settleOne(t, invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{finish(a.Lease)}, Ack: true, Retention: time.Hour}); r.Err != nil {
		t.Fatalf("finish with the ack: %v", r.Err)
	}
	s.wantPending(t, "after the ack", s.key, false)
	state := s.h.State(t, s.key)
	if state["__terminal"] != "1" || state[field] != "ok" {
		t.Errorf("state after the ack = %v, want %s ok and __terminal 1", state, field)
	}
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Terminal {
		t.Errorf("claim after the ack = %+v, want terminal", got)
	}
	// The ack of the other message, without transitions, retains its
	// state alone.
	b := s.claimOf(t, s.other, field, time.Hour, 3)
	s.finish(t, b.Lease)
	s.ack(t, s.other, time.Hour)
	if state := s.h.State(t, s.other); state["__terminal"] != "1" || state[field] != "ok" {
		t.Errorf("state after an ack of its own = %v, want %s ok and __terminal 1", state, field)
	}
	// A settlement that says Stateless beside transitions has state: it is
	// retained too.
	key := s.h.Deliver(t)
	c := s.claimOf(t, key, field, time.Hour, 3)
	if r := s.settleOne(t, invocation.Settlement{Key: key, Transitions: []invocation.Transition{finish(c.Lease)}, Ack: true, Stateless: true, Retention: time.Hour}); r.Err != nil {
		t.Fatalf("finish with a stateless ack: %v", r.Err)
	}
	if state := s.h.State(t, key); state["__terminal"] != "1" {
		t.Errorf("state after an ack marked Stateless beside a transition = %v, want it retained", state)
	}
}

// stateAckWithoutRetentionLeavesNoState: at retention 0 the ack deletes
// the message's state in the same step: nothing of it is left but its
// dead-letter entries.
func stateAckWithoutRetentionLeavesNoState(t *testing.T, s *stateSuite) {
	a := s.claim(t, field, time.Hour, 3)
	b := s.claim(t, otherField, time.Hour, 1)
	if _, err := s.h.Store.Pin(t.Context(), s.key, "__schedule", "x"); err != nil {
		t.Fatal(err)
	}
	r := s.settleOne(t, invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{finish(a.Lease), exhaust(b.Lease)}, Ack: true})
	if r.Err != nil {
		t.Fatalf("settlement with the ack at retention 0: %v", r.Err)
	}
	s.wantPending(t, "after the ack", s.key, false)
	if state := s.h.State(t, s.key); len(state) != 0 {
		t.Errorf("state after the ack at retention 0 = %v, want none", state)
	}
	if got := s.h.DeadLetters(t, s.key); len(got) != 1 || got[0].ID != r.Transitions[1].DLQID {
		t.Errorf("dead letters = %+v, want the entry %s kept", got, r.Transitions[1].DLQID)
	}
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Terminal {
		t.Errorf("claim after the ack = %+v, want terminal", got)
	}
	if state := s.h.State(t, s.key); len(state) != 0 {
		t.Errorf("a claim after the ack created state %v", state)
	}
}

// stateStatelessAck: a message that never had state (it matched nothing)
// is acknowledged alone, and no state is created for it, whatever the
// retention; once acknowledged, a second stateless ack is ErrTerminal.
func stateStatelessAck(t *testing.T, s *stateSuite) {
	for _, key := range []invocation.Key{s.key, s.other} {
		retention := map[bool]time.Duration{true: time.Hour, false: 0}[key == s.key]
		st := invocation.Settlement{Key: key, Ack: true, Stateless: true, Retention: retention}
		if r := s.settleOne(t, st); r.Err != nil || len(r.Transitions) != 0 {
			t.Fatalf("stateless ack (retention %v) = %+v", retention, r)
		}
		s.wantPending(t, "after a stateless ack", key, false)
		if state := s.h.State(t, key); len(state) != 0 {
			t.Errorf("a stateless ack (retention %v) created state %v", retention, state)
		}
		s.wantErr(t, "stateless ack again", invocation.ErrTerminal, s.settleOne(t, st).Err)
		if got := s.claimOf(t, key, field, time.Hour, 3); got.Status != invocation.Terminal {
			t.Errorf("claim after a stateless ack = %+v, want terminal", got)
		}
	}
	if s.h.Redeliver != nil {
		s.runsAgain(t, "after a stateless ack (it retained nothing)")
	}
}

// stateBatchesAnswerPerItem: one Settle call of several settlements, and
// one Claim call of several requests, answer each item as it would be
// answered alone, in order; a malformed item fails alone.
func stateBatchesAnswerPerItem(t *testing.T, s *stateSuite) {
	ctx := t.Context()
	acked := s.h.Deliver(t)
	s.h.Ack(t, acked)
	claims := s.h.Store.Claim(ctx, []invocation.ClaimRequest{
		{Key: s.key, Field: field, Lease: time.Hour, MaxAttempts: 3},
		{Key: s.key, Field: field, Lease: time.Hour, MaxAttempts: 3}, // the same invocation: one winner
		{Key: s.key, Field: "", Lease: time.Hour, MaxAttempts: 3},    // malformed
		{Key: s.other, Field: field, Lease: time.Hour, MaxAttempts: 3},
		{Key: acked, Field: field, Lease: time.Hour, MaxAttempts: 3},
		{Key: s.key, Field: otherField, Lease: time.Hour, MaxAttempts: 3, Probe: true},
	})
	if len(claims) != 6 {
		t.Fatalf("Claim of 6 requests returned %d results", len(claims))
	}
	var got []string
	for _, c := range claims {
		if c.Err != nil {
			got = append(got, "error")
			continue
		}
		got = append(got, c.Status.String())
	}
	if want := []string{"claimed", "running", "error", "claimed", "terminal", "probed"}; !slices.Equal(got, want) {
		t.Fatalf("batch of claims = %v, want %v", got, want)
	}
	if isContractErr(claims[2].Err) {
		t.Errorf("malformed claim: %v, want an argument error", claims[2].Err)
	}
	stale := claims[3].Lease
	stale.Token += "x"
	res := s.h.Store.Settle(ctx, []invocation.Settlement{
		{Key: s.key, Transitions: []invocation.Transition{finish(claims[0].Lease)}, Ack: true, Retention: time.Hour},
		{Key: s.other, Transitions: []invocation.Transition{retry(stale, 0)}},
		{Key: s.other, Transitions: []invocation.Transition{retry(claims[3].Lease, -time.Second)}}, // malformed
		{Key: acked, Ack: true, Retention: time.Hour},
		{Key: s.other, Transitions: []invocation.Transition{retry(claims[3].Lease, time.Hour)}},
	})
	if len(res) != 5 {
		t.Fatalf("Settle of 5 settlements returned %d results", len(res))
	}
	if res[0].Err != nil || !errors.Is(res[1].Err, invocation.ErrStale) || res[2].Err == nil || isContractErr(res[2].Err) ||
		!errors.Is(res[3].Err, invocation.ErrTerminal) || res[4].Err != nil || len(res[4].Transitions) != 1 || res[4].Transitions[0].Next.IsZero() {
		t.Fatalf("batch of settlements = %+v; want applied, stale, an argument error, terminal, applied with a next attempt", res)
	}
	s.wantPending(t, "the settled message", s.key, false)
	s.wantPending(t, "the other message", s.other, true)
	if got := s.claimOf(t, s.other, field, time.Hour, 3); got.Status != invocation.NotDue || !got.NextAttemptAt.Equal(res[4].Transitions[0].Next) {
		t.Errorf("claim of the retried invocation = %+v, want not due at %v", got, res[4].Transitions[0].Next)
	}
}
