package relaytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/invocation"
)

// StateStore is an in-memory relay.StateStore with the semantics of
// redisstate.Store (docs/delivery.md#invocation-state; see that package's doc
// for the state machine): one hash per message key, one field per invocation
// "<app>/<handler>", every transition fenced on the lease's attempt and
// token, inert once the hash is retained or, with WithStream or
// WithPending, once the message left its group's PEL (acknowledged, or its
// reference cleared), whatever the hash holds; settlements applied
// atomically per message, their dead-letter entries written to the DLQ
// given WithDLQ and their acknowledgements made on the Stream given
// WithStream; first-writer-wins pins in reserved fields (Pin); the trace
// lineage of the latest unsuccessful attempt (Lease.Trace, returned by the
// next Claim as Claim.PrevTrace); and claims given back uncharged when
// their reply was lost (Void, relay.ClaimVoider). Its clock plays the part
// of the Redis server's TIME: deadlines are Unix milliseconds of it.
//
// Arguments are checked as redisstate.Store checks them, with errors that
// name the operation, the invocation field and the hash; ErrStale and
// ErrTerminal are wrapped the same way. A cancelled context fails a call
// before it changes anything.
//
// Safe for concurrent use; every method is atomic, as a Lua script is.
type StateStore struct {
	clock     Clock
	token     func() string
	isPending func(invocation.Key) bool
	stream    *Stream // WithStream: where Settle acknowledges
	dlq       *DLQ    // WithDLQ: where Settle writes dead-letter entries

	mu     sync.Mutex
	hashes map[invocation.Key]*stateHash
	gates  gates
}

// stateHash is one message's hash.
type stateHash struct {
	fields map[string]stateValue
	// reserved holds the "__" fields other than __terminal: pins
	// ("__schedule") and trace lineage ("__trace:<field>").
	reserved map[string]string
	// terminal is the reserved __terminal marker; expiresMS its TTL (0: none).
	terminal  bool
	expiresMS int64
}

func newHash() *stateHash {
	return &stateHash{fields: map[string]stateValue{}, reserved: map[string]string{}}
}

// traceField is invocation.TraceField: where the lineage of field is kept.
func traceField(field string) string { return invocation.TraceField(field) }

// saveTrace stores a non-empty trace lineage of field, as save_trace in
// prelude.lua does.
func (h *stateHash) saveTrace(field, trace string) {
	if trace != "" {
		h.reserved[traceField(field)] = trace
	}
}

type stateKind int

const (
	kindRunning stateKind = iota + 1
	kindNextAttempt
	kindOK
	kindExhausted
	kindSuperseded
)

// stateValue is one field's value, the parsed form of the strings
// redisstate.Store writes (running:<deadline_ms>:<attempt>:<token>, ...).
type stateValue struct {
	kind       stateKind
	deadlineMS int64 // running, next attempt
	attempt    int
	token      string
	dlq        bool   // exhausted with its DLQ entry recorded
	by         string // superseded: the newer message's id
}

// String returns the value as redisstate.Store stores it.
func (v stateValue) String() string {
	switch v.kind {
	case kindRunning:
		return fmt.Sprintf("running:%d:%d:%s", v.deadlineMS, v.attempt, v.token)
	case kindNextAttempt:
		return fmt.Sprintf("next_attempt_at:%d:%d:%s", v.deadlineMS, v.attempt, v.token)
	case kindOK:
		return "ok"
	case kindExhausted:
		s := fmt.Sprintf("exhausted:%d:%s", v.attempt, v.token)
		if v.dlq {
			s += ":dlq"
		}
		return s
	case kindSuperseded:
		return "superseded:" + v.by
	}
	return "?"
}

// NewStateStore returns an empty StateStore. Options: WithClock,
// WithTokenSource, WithStream (the Stream whose PEL fences transitions and
// on which Settle acknowledges), WithPending (a PEL of another kind, when
// there is no Stream) and WithDLQ (where Settle writes dead-letter
// entries). Without WithStream an acknowledgement only retains the state;
// without WithDLQ a settlement that writes an entry fails.
func NewStateStore(opts ...Option) *StateStore {
	o := buildConfig("NewStateStore", opts, "WithClock", "WithTokenSource", "WithPending", "WithStream", "WithDLQ")
	if o.stream != nil && o.pending != nil {
		panic("relaytest: NewStateStore: WithStream and WithPending both say which messages are pending; give one")
	}
	st := &StateStore{clock: o.clock, token: o.token, isPending: o.pending, stream: o.stream, dlq: o.dlq, hashes: map[invocation.Key]*stateHash{}, gates: newGates()}
	if o.stream != nil {
		st.isPending = func(k invocation.Key) bool { return o.stream.IsPending(k.MessageID) }
	}
	return st
}

// hash returns the live hash of key at nowMS, dropping it first when its
// retention TTL has run out (as Redis expires a key: strictly after the
// deadline). It returns nil when there is none. s.mu must be held.
func (s *StateStore) hash(key invocation.Key, nowMS int64) *stateHash {
	h := s.hashes[key]
	if h != nil && h.expiresMS != 0 && nowMS > h.expiresMS {
		delete(s.hashes, key)
		return nil
	}
	return h
}

// matchedField is the reserved field that marks a complete record of a
// message's invocations (invocation.Record).
const matchedField = "__matched"

// Claim implements relay.StateStore.Claim as claim.lua does, for each of
// reqs; see redisstate.Store.Claim for every outcome, and for Record and
// Probe. A message that is not pending (WithStream, WithPending) is
// Terminal and nothing is written. A claim whose token the field holds
// already was given back by Void before it ran: it fails and writes
// nothing.
func (s *StateStore) Claim(ctx context.Context, reqs []invocation.ClaimRequest) []invocation.ClaimResult {
	out := make([]invocation.ClaimResult, len(reqs))
	for i, r := range reqs {
		c, err := s.claim(ctx, r)
		out[i] = invocation.ClaimResult{Claim: c, Err: err}
	}
	return out
}

func (s *StateStore) claim(ctx context.Context, r invocation.ClaimRequest) (invocation.Claim, error) {
	fail := func(err error) (invocation.Claim, error) {
		return invocation.Claim{}, fmt.Errorf("claim %s in %s: %w", r.Field, hashName(r.Key), err)
	}
	token := s.token()
	if err := checkClaim(ctx, r, token); err != nil {
		return fail(err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	now := nowMS(s.clock)
	h := s.hash(r.Key, now)
	if h != nil && h.terminal {
		return invocation.Claim{Status: invocation.Terminal}, nil
	}
	if !s.pending(r.Key) {
		return invocation.Claim{Status: invocation.Terminal, NotPending: true}, nil
	}
	if h != nil {
		if v, ok := h.fields[r.Field]; ok && strings.HasSuffix(v.String(), ":"+token) {
			// Only Void writes a claim's token before the claim runs: the
			// caller gave this claim up for lost, so it records nothing.
			return fail(errors.New("claim voided before it ran: its token was given back (Void)"))
		}
	}
	c := claimer{s: s, key: r.Key, field: r.Field, lease: r.Lease, maxAttempts: r.MaxAttempts, probe: r.Probe, gate: r.Gate, token: token, now: now, h: h}
	c.record(r.Record)
	out, err := c.decide()
	if err != nil {
		return fail(err)
	}
	return out, nil
}

// checkClaim refuses what redisstate.Store's Claim refuses, and a done ctx.
func checkClaim(ctx context.Context, r invocation.ClaimRequest, token string) error {
	if err := r.Check(); err != nil {
		return err
	}
	if err := invocation.CheckToken(token); err != nil {
		return err
	}
	return ctx.Err()
}

// claimer decides one Claim of field in key's hash h (nil: none yet) at
// now, with s.mu held, as claim_one in invocation's prelude.lua does.
type claimer struct {
	s           *StateStore
	key         invocation.Key
	field       string
	lease       time.Duration
	maxAttempts int
	probe       bool
	gate        invocation.Gate
	token       string
	now         int64
	h           *stateHash
}

// ensure returns the hash, creating it when missing.
func (c *claimer) ensure() *stateHash {
	if c.h == nil {
		c.h = newHash()
		c.s.hashes[c.key] = c.h
	}
	return c.h
}

// record stores rec's fields as due with no attempt used unless they have
// state, and the complete marker.
func (c *claimer) record(rec invocation.Record) {
	if !rec.Complete && len(rec.Fields) == 0 {
		return
	}
	h := c.ensure()
	for _, f := range rec.Fields {
		if _, ok := h.fields[f]; !ok {
			h.fields[f] = stateValue{kind: kindNextAttempt, deadlineMS: c.now, attempt: 0, token: c.token}
		}
	}
	if rec.Complete {
		h.reserved[matchedField] = "1"
	}
}

func (c *claimer) prevTrace() string {
	if c.h == nil {
		return ""
	}
	return c.h.reserved[traceField(c.field)]
}

// start claims attempt: the field runs until now+lease. A probe records
// the field due now with the attempts before it used, instead.
func (c *claimer) start(attempt int) invocation.Claim {
	if c.probe {
		c.ensure().fields[c.field] = stateValue{kind: kindNextAttempt, deadlineMS: c.now, attempt: attempt - 1, token: c.token}
		l := invocation.Lease{Key: c.key, Field: c.field, Attempt: attempt - 1, Token: c.token}
		return invocation.Claim{Status: invocation.Probed, Lease: l}
	}
	deadline := c.now + c.lease.Milliseconds()
	if !c.gate.IsZero() {
		if out, ok := c.s.gates.pass(c.key, c.field, c.gate, attempt, c.now, deadline); !ok {
			h := c.ensure()
			if out.Status == invocation.Superseded {
				h.fields[c.field] = stateValue{kind: kindSuperseded, by: out.SupersededBy}
			} else if _, ok := h.fields[c.field]; !ok {
				// Recorded due, as the record does, so a redelivery
				// finds the invocation unfinished.
				h.fields[c.field] = stateValue{kind: kindNextAttempt, deadlineMS: c.now, token: c.token}
			}
			return out
		}
	}
	c.ensure().fields[c.field] = stateValue{kind: kindRunning, deadlineMS: deadline, attempt: attempt, token: c.token}
	l := invocation.Lease{Key: c.key, Field: c.field, Attempt: attempt, Token: c.token, Deadline: time.UnixMilli(deadline)}
	return invocation.Claim{Status: invocation.Claimed, Lease: l, PrevTrace: c.prevTrace()}
}

// nextAfter starts the attempt after executed ones, or exhausts the field
// when they were the last. lost is the attempt whose expired lease this
// claim charges, or 0.
func (c *claimer) nextAfter(executed, lost int) invocation.Claim {
	if executed >= c.maxAttempts {
		c.h.fields[c.field] = stateValue{kind: kindExhausted, attempt: executed, token: c.token}
		l := invocation.Lease{Key: c.key, Field: c.field, Attempt: executed, Token: c.token}
		return invocation.Claim{Status: invocation.Exhausted, Lease: l, PrevTrace: c.prevTrace(), Lost: lost}
	}
	out := c.start(executed + 1)
	if out.Status == invocation.Claimed || out.Status == invocation.Probed {
		out.Lost = lost // charged with the field written; a gate writes none
	}
	return out
}

// decide reads the field's value and claims, or reports, accordingly.
func (c *claimer) decide() (invocation.Claim, error) {
	var v stateValue
	var ok bool
	if c.h != nil {
		v, ok = c.h.fields[c.field]
	}
	if !ok {
		return c.start(1), nil
	}
	switch v.kind {
	case kindOK:
		return invocation.Claim{Status: invocation.Succeeded}, nil
	case kindSuperseded:
		return invocation.Claim{Status: invocation.Superseded, SupersededBy: v.by}, nil
	case kindRunning:
		if v.deadlineMS > c.now {
			l := invocation.Lease{Key: c.key, Field: c.field, Attempt: v.attempt}
			return invocation.Claim{Status: invocation.Running, Lease: l, RunningUntil: time.UnixMilli(v.deadlineMS)}, nil
		}
		// The owner died or stalled mid-run: that attempt counts as failed.
		return c.nextAfter(v.attempt, v.attempt), nil
	case kindNextAttempt:
		if v.deadlineMS > c.now {
			l := invocation.Lease{Key: c.key, Field: c.field, Attempt: v.attempt}
			return invocation.Claim{Status: invocation.NotDue, Lease: l, NextAttemptAt: time.UnixMilli(v.deadlineMS)}, nil
		}
		return c.nextAfter(v.attempt, 0), nil
	case kindExhausted:
		l := invocation.Lease{Key: c.key, Field: c.field, Attempt: v.attempt, Token: v.token}
		st := invocation.Exhausted
		if v.dlq {
			st = invocation.DeadLettered
		}
		return invocation.Claim{Status: st, Lease: l, PrevTrace: c.prevTrace()}, nil
	}
	return invocation.Claim{}, fmt.Errorf("malformed state %q", v)
}

// Void implements relay.ClaimVoider as void.lua does (redisstate.Store.Void,
// docs/delivery.md#lost-replies): it gives back the claim of l.Field with
// l.Token whose outcome the caller did not learn; l.Attempt is ignored. A
// field running with that token is released as Release does, uncharged; a
// field without state becomes due with no attempt used, and a waiting one
// takes the token, due time and count unchanged, so that the claim, should
// it come after Void, finds its own token and records nothing (Claim). Any
// other value is left alone. Idempotent. ErrTerminal on a retained hash or
// when the message is not pending (WithPending).
func (s *StateStore) Void(ctx context.Context, l invocation.Lease) error {
	// Field and token are checked as Store.Void checks them.
	check := invocation.Lease{Field: l.Field, Attempt: 1, Token: l.Token}
	return s.fenced(ctx, fmt.Sprintf("void claim %s of", l.Token), l, check, func(h *stateHash, now int64) error {
		if h == nil {
			h = newHash()
			s.hashes[l.Key] = h
		}
		v, ok := h.fields[l.Field]
		switch {
		case !ok:
			h.fields[l.Field] = stateValue{kind: kindNextAttempt, deadlineMS: now, attempt: 0, token: l.Token}
		case v.kind == kindRunning && v.token == l.Token:
			h.fields[l.Field] = stateValue{kind: kindNextAttempt, deadlineMS: now, attempt: v.attempt - 1, token: l.Token}
		case v.kind == kindNextAttempt && v.token != l.Token:
			v.token = l.Token
			h.fields[l.Field] = v
		}
		return nil
	})
}

// Settle implements relay.StateStore.Settle as settle.lua does, for each
// of ss (see redisstate.Store.Settle): each settlement applies whole or
// not at all. Its transitions are fenced on their leases (an Exhaust or
// DeadLetter already written with the same lease is not written again);
// an acknowledgement removes the message from the Stream's PEL
// (WithStream) and applies the retention (deleted with 0, else retained
// with a TTL); a dead-letter entry goes to the DLQ (WithDLQ), validated
// and defaulted as redisdlq.Writer.Write does (an empty OriginalStream is the
// settlement's stream, which must be the DLQ's). ErrTerminal on a
// retained hash or a message not pending, ErrStale when a lease lost its
// token.
func (s *StateStore) Settle(ctx context.Context, ss []invocation.Settlement) []invocation.SettleResult {
	out := make([]invocation.SettleResult, len(ss))
	for i, st := range ss {
		res, err := s.settle(ctx, st)
		if err != nil {
			err = fmt.Errorf("settle %s: %w", hashName(st.Key), err)
		}
		out[i] = invocation.SettleResult{Err: err, Transitions: res}
	}
	return out
}

func (s *StateStore) settle(ctx context.Context, st invocation.Settlement) ([]invocation.TransitionResult, error) {
	if err := st.Check(); err != nil {
		return nil, err
	}
	entries := make([]dlq.Entry, len(st.Transitions))
	for i, t := range st.Transitions {
		if t.Entry == nil {
			continue
		}
		if s.dlq == nil {
			return nil, fmt.Errorf("%s %s: a dead-letter entry, and no DLQ (WithDLQ)", t.Kind, t.Lease.Field)
		}
		e := *t.Entry
		if e.OriginalStream == "" {
			e.OriginalStream = st.Key.Stream // as redisstate.Store fills it
		}
		e, err := s.dlq.check(e)
		if err != nil {
			return nil, fmt.Errorf("%s %s: dead-letter entry: %w", t.Kind, t.Lease.Field, err)
		}
		entries[i] = e
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := nowMS(s.clock)
	h := s.hash(st.Key, now)
	if st.Cleared {
		if s.isPending != nil && s.isPending(st.Key) {
			return nil, fmt.Errorf("message %s is still pending in %s group %s: its state is live", st.Key.MessageID, st.Key.Stream, st.Key.Group)
		}
		s.retainLocked(st.Key, st.Retention, now)
		return nil, nil
	}
	done := make([]bool, len(st.Transitions))
	if len(st.Transitions) > 0 {
		if h != nil && h.terminal {
			return nil, invocation.ErrTerminal
		}
		for i, t := range st.Transitions {
			var ok bool
			if ok, done[i] = fencedBy(h, t); !ok {
				if !s.pending(st.Key) {
					return nil, invocation.ErrTerminal
				}
				return nil, invocation.ErrStale
			}
		}
	}
	if !s.pending(st.Key) {
		return nil, invocation.ErrTerminal
	}
	if st.Ack && s.stream != nil {
		s.stream.ack(st.Key.MessageID)
	}
	res := make([]invocation.TransitionResult, len(st.Transitions))
	for i, t := range st.Transitions {
		l := t.Lease
		s.gates.release(st.Key, t)
		if h == nil {
			h = newHash()
			s.hashes[st.Key] = h
		}
		switch t.Kind {
		case invocation.Finish:
			h.fields[l.Field] = stateValue{kind: kindOK}
		case invocation.Retry:
			next := now + t.Backoff.Milliseconds()
			h.fields[l.Field] = stateValue{kind: kindNextAttempt, deadlineMS: next, attempt: l.Attempt, token: l.Token}
			h.saveTrace(l.Field, l.Trace)
			res[i].Next = time.UnixMilli(next)
		case invocation.Release:
			h.fields[l.Field] = stateValue{kind: kindNextAttempt, deadlineMS: now, attempt: l.Attempt - 1, token: l.Token}
			h.saveTrace(l.Field, l.Trace)
		case invocation.Exhaust, invocation.DeadLetter:
			if done[i] {
				continue
			}
			res[i].DLQID = s.dlq.append(entries[i])
			h.fields[l.Field] = stateValue{kind: kindExhausted, attempt: l.Attempt, token: l.Token, dlq: true}
			h.reserved[invocation.DLQField(l.Field)] = res[i].DLQID
			if t.Kind == invocation.Exhaust {
				h.saveTrace(l.Field, l.Trace)
			}
		}
	}
	// Stateless says something only without transitions, as settle.lua
	// reads it: a settlement that writes a transition has state to retain.
	if st.Ack && (!st.Stateless || len(st.Transitions) > 0) {
		s.retainLocked(st.Key, st.Retention, now)
	}
	return res, nil
}

// fencedBy reports whether transition t may apply to hash h (nil: none),
// as settle.lua fences it, and whether it was applied before: an Exhaust
// or a DeadLetter whose field is exhausted with t's lease and marked.
func fencedBy(h *stateHash, t invocation.Transition) (ok, done bool) {
	if h == nil {
		return false, false
	}
	v, has := h.fields[t.Lease.Field]
	same := has && v.attempt == t.Lease.Attempt && v.token == t.Lease.Token
	switch {
	case !same:
		return false, false
	case v.kind == kindExhausted && v.dlq && (t.Kind == invocation.Exhaust || t.Kind == invocation.DeadLetter):
		return true, true
	case t.Kind == invocation.DeadLetter:
		return v.kind == kindExhausted, false
	}
	return v.kind == kindRunning, false
}

// retainLocked applies retention to key's hash, if there is one: deleted
// with 0, else retained with a TTL unless it is already. s.mu must be held.
func (s *StateStore) retainLocked(key invocation.Key, retention time.Duration, now int64) {
	h := s.hash(key, now)
	switch {
	case h == nil:
	case retention == 0:
		delete(s.hashes, key)
	case !h.terminal:
		h.terminal = true
		h.expiresMS = now + retention.Milliseconds()
	}
}

// Pin implements relay.StateStore.Pin as pin.lua does: it stores value in
// the reserved field of key's hash unless that holds a value already, and
// returns the value that holds now (first writer wins). field must start
// with "__" and be neither "__terminal" nor a trace field ("__trace:...").
// ErrTerminal on a retained hash or when the message is not pending.
func (s *StateStore) Pin(ctx context.Context, key invocation.Key, field, value string) (string, error) {
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("pin %s in %s: %w", field, hashName(key), err)
	}
	if !strings.HasPrefix(field, "__") || field == "__terminal" || strings.HasPrefix(field, traceField("")) || len(field) < 3 {
		return fail(errors.New(`field must be a reserved "__<name>" other than __terminal and __trace:*`))
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hash(key, nowMS(s.clock))
	if h != nil && h.terminal || !s.pending(key) {
		return fail(invocation.ErrTerminal)
	}
	if h == nil {
		h = newHash()
		s.hashes[key] = h
	}
	if v, ok := h.reserved[field]; ok {
		return v, nil
	}
	h.reserved[field] = value
	return value, nil
}

// Unfinished implements relay.StateStore.Unfinished as redisstate.Store
// does: the fields that are running, waiting for a retry (recorded ones
// included) or exhausted without a recorded DLQ entry, sorted, and whether
// the first delivery's record is complete; nothing once retained.
func (s *StateStore) Unfinished(ctx context.Context, key invocation.Key) (invocation.Unfinished, error) {
	if err := ctx.Err(); err != nil {
		return invocation.Unfinished{}, fmt.Errorf("unfinished %s: %w", hashName(key), err)
	}
	return invocation.UnfinishedOf(s.Get(key)), nil
}

// Get returns every field of the hash of key as redisstate.Store.Get does:
// invocation fields with values in redisstate.Store's wire form
// ("running:<deadline_ms>:<attempt>:<token>", "ok", ...), the reserved
// fields ("__terminal" = "1" once retained, pins, "__trace:<field>"); an
// empty map when there is none. For assertions in tests.
func (s *StateStore) Get(key invocation.Key) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	h := s.hash(key, nowMS(s.clock))
	if h == nil {
		return out
	}
	for f, v := range h.fields {
		out[f] = v.String()
	}
	for f, v := range h.reserved {
		out[f] = v
	}
	if h.terminal {
		out["__terminal"] = "1"
	}
	return out
}

// TTL returns the time left before the retained hash of key expires, and
// false when the hash does not exist or has no TTL (it is not retained).
func (s *StateStore) TTL(key invocation.Key) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := nowMS(s.clock)
	h := s.hash(key, now)
	if h == nil || h.expiresMS == 0 {
		return 0, false
	}
	return time.Duration(h.expiresMS-now) * time.Millisecond, true
}

// fenced checks check as redisstate.Store checks a lease in Go and, under
// the store's lock, returns ErrTerminal on a retained hash or when l's
// message is not pending (WithPending); otherwise it returns what fn
// returns, given l's hash (nil when none) and the store's time. Errors
// name op, l's field and hash.
func (s *StateStore) fenced(ctx context.Context, op string, l, check invocation.Lease, fn func(h *stateHash, nowMS int64) error) error {
	fail := func(err error) error {
		return fmt.Errorf("%s %s in %s: %w", op, l.Field, hashName(l.Key), err)
	}
	if err := check.Check(); err != nil {
		return fail(err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := nowMS(s.clock)
	h := s.hash(l.Key, now)
	if h != nil && h.terminal || !s.pending(l.Key) {
		return fail(invocation.ErrTerminal)
	}
	if err := fn(h, now); err != nil {
		return fail(err)
	}
	return nil
}

// pending reports whether key's message is in its group's PEL, as the
// function given WithPending says; without one every message counts as
// pending.
func (s *StateStore) pending(key invocation.Key) bool {
	return s.isPending == nil || s.isPending(key)
}

func hashName(k invocation.Key) string { return keys.Invocation(k.Stream, k.Group, k.MessageID) }
