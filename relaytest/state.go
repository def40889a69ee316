package relaytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/invocation"
)

// StateStore is an in-memory relay.StateStore with the semantics of
// invocation.Store (docs/delivery.md#invocation-state; see that package's doc
// for the state machine): one hash per message key, one field per invocation
// "<app>/<handler>", every transition fenced on the lease's attempt and
// token, inert once the hash is retained or, with WithPending, once the
// message left its group's PEL (acknowledged, or its reference cleared),
// whatever the hash holds; first-writer-wins pins in reserved fields (Pin);
// the trace lineage of the latest unsuccessful attempt (Lease.Trace,
// returned by the next Claim as Claim.PrevTrace); and claims given back
// uncharged when their reply was lost (Void, relay.ClaimVoider). Its clock
// plays the part of the Redis server's TIME: deadlines are Unix
// milliseconds of it.
//
// Arguments are checked as invocation.Store checks them, with errors that
// name the operation, the invocation field and the hash; ErrStale and
// ErrTerminal are wrapped the same way. A cancelled context fails a call
// before it changes anything.
//
// Safe for concurrent use; every method is atomic, as a Lua script is.
type StateStore struct {
	clock     Clock
	token     func() string
	isPending func(invocation.Key) bool

	mu     sync.Mutex
	hashes map[invocation.Key]*stateHash
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
)

// stateValue is one field's value, the parsed form of the strings
// invocation.Store writes (running:<deadline_ms>:<attempt>:<token>, ...).
type stateValue struct {
	kind       stateKind
	deadlineMS int64 // running, next attempt
	attempt    int
	token      string
	dlq        bool // exhausted with its DLQ entry recorded
}

// String returns the value as invocation.Store stores it.
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
	}
	return "?"
}

// NewStateStore returns an empty StateStore. Options: WithClock,
// WithTokenSource, WithPending.
func NewStateStore(opts ...Option) *StateStore {
	o := buildConfig("NewStateStore", opts, "WithClock", "WithTokenSource", "WithPending")
	return &StateStore{clock: o.clock, token: o.token, isPending: o.pending, hashes: map[invocation.Key]*stateHash{}}
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

// Claim implements relay.StateStore.Claim as claim.lua does; see
// invocation.Store.Claim for every outcome, and for rec. A message that is
// not pending (WithPending) is Terminal and nothing is written. A claim
// whose token the field holds already was given back by Void before it
// ran: it fails and writes nothing.
func (s *StateStore) Claim(ctx context.Context, key invocation.Key, field string, lease time.Duration, maxAttempts int, rec invocation.Record) (invocation.Claim, error) {
	fail := func(err error) (invocation.Claim, error) {
		return invocation.Claim{}, fmt.Errorf("claim %s in %s: %w", field, hashName(key), err)
	}
	token := s.token()
	if err := checkClaim(ctx, field, lease, maxAttempts, rec, token); err != nil {
		return fail(err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	now := nowMS(s.clock)
	h := s.hash(key, now)
	if h != nil && h.terminal || !s.pending(key) {
		return invocation.Claim{Status: invocation.Terminal}, nil
	}
	if h != nil {
		if v, ok := h.fields[field]; ok && strings.HasSuffix(v.String(), ":"+token) {
			// Only Void writes a claim's token before the claim runs: the
			// caller gave this claim up for lost, so it records nothing.
			return fail(errors.New("claim voided before it ran: its token was given back (Void)"))
		}
	}
	c := claimer{s: s, key: key, field: field, lease: lease, maxAttempts: maxAttempts, token: token, now: now, h: h}
	c.record(rec)
	out, err := c.decide()
	if err != nil {
		return fail(err)
	}
	return out, nil
}

// checkClaim refuses what invocation.Store's Claim refuses, and a done ctx.
func checkClaim(ctx context.Context, field string, lease time.Duration, maxAttempts int, rec invocation.Record, token string) error {
	if err := invocation.CheckClaim(field, lease, maxAttempts); err != nil {
		return err
	}
	if err := invocation.CheckRecord(field, rec); err != nil {
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

// start claims attempt: the field runs until now+lease.
func (c *claimer) start(attempt int) invocation.Claim {
	deadline := c.now + c.lease.Milliseconds()
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
	out.Lost = lost
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
	case kindRunning:
		if v.deadlineMS > c.now {
			return invocation.Claim{Status: invocation.Running, RunningUntil: time.UnixMilli(v.deadlineMS)}, nil
		}
		// The owner died or stalled mid-run: that attempt counts as failed.
		return c.nextAfter(v.attempt, v.attempt), nil
	case kindNextAttempt:
		if v.deadlineMS > c.now {
			return invocation.Claim{Status: invocation.NotDue, NextAttemptAt: time.UnixMilli(v.deadlineMS)}, nil
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

// Release implements relay.StateStore.Release as release.lua does: the
// attempt becomes due at once with attempt-1 used (0 for attempt 1, which
// stays recorded as unfinished); a non-empty l.Trace is kept as the lineage. ErrStale
// unless the field is running with l's attempt and token; ErrTerminal on a
// retained hash.
func (s *StateStore) Release(ctx context.Context, l invocation.Lease) error {
	return s.transition(ctx, "release", l, kindRunning, func(h *stateHash, _ stateValue, now int64) {
		h.saveTrace(l.Field, l.Trace)
		h.fields[l.Field] = stateValue{kind: kindNextAttempt, deadlineMS: now, attempt: l.Attempt - 1, token: l.Token}
	})
}

// Void implements relay.ClaimVoider as void.lua does (invocation.Store.Void,
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

// Finish implements relay.StateStore.Finish as finish.lua does: the field
// becomes "ok". ErrStale unless the field is running with l's attempt and
// token, including when it is "ok" already; ErrTerminal on a retained hash.
func (s *StateStore) Finish(ctx context.Context, l invocation.Lease) error {
	return s.transition(ctx, "finish", l, kindRunning, func(h *stateHash, _ stateValue, _ int64) {
		h.fields[l.Field] = stateValue{kind: kindOK}
	})
}

// ScheduleRetry implements relay.StateStore.ScheduleRetry as
// schedule_retry.lua does and returns now+backoff (ms precision) on the
// store's clock; a non-empty l.Trace is kept as the lineage. backoff must be
// >= 0. ErrStale unless the field is running with l's attempt and token;
// ErrTerminal on a retained hash.
func (s *StateStore) ScheduleRetry(ctx context.Context, l invocation.Lease, backoff time.Duration) (time.Time, error) {
	if backoff < 0 {
		return time.Time{}, fmt.Errorf("schedule_retry %s in %s: backoff %v: must be >= 0", l.Field, hashName(l.Key), backoff)
	}
	var next int64
	err := s.transition(ctx, "schedule_retry", l, kindRunning, func(h *stateHash, _ stateValue, now int64) {
		next = now + backoff.Milliseconds()
		h.fields[l.Field] = stateValue{kind: kindNextAttempt, deadlineMS: next, attempt: l.Attempt, token: l.Token}
		h.saveTrace(l.Field, l.Trace)
	})
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(next), nil
}

// Exhaust implements relay.StateStore.Exhaust as exhaust.lua does; a
// non-empty l.Trace is kept as the lineage. ErrStale unless the field is
// running with l's attempt and token; ErrTerminal on a retained hash.
func (s *StateStore) Exhaust(ctx context.Context, l invocation.Lease) error {
	return s.transition(ctx, "exhaust", l, kindRunning, func(h *stateHash, _ stateValue, _ int64) {
		h.fields[l.Field] = stateValue{kind: kindExhausted, attempt: l.Attempt, token: l.Token}
		h.saveTrace(l.Field, l.Trace)
	})
}

// MarkDLQ implements relay.StateStore.MarkDLQ as mark_dlq.lua does.
// Idempotent. ErrStale unless the field is exhausted with l's attempt and
// token; ErrTerminal on a retained hash.
func (s *StateStore) MarkDLQ(ctx context.Context, l invocation.Lease) error {
	return s.transition(ctx, "mark_dlq", l, kindExhausted, func(h *stateHash, v stateValue, _ int64) {
		v.dlq = true
		h.fields[l.Field] = v
	})
}

// Retain implements relay.StateStore.Retain as retain.lua does: with
// retention 0 it deletes the hash of key; otherwise it marks it terminal
// with a TTL of retention (ms precision) on the store's clock, a running
// TTL being kept (idempotent). A missing hash stays missing. A message
// still pending (WithPending) is left alone and an error returned. When
// the TTL has run out the hash is gone, as if never written.
func (s *StateStore) Retain(ctx context.Context, key invocation.Key, retention time.Duration) error {
	fail := func(err error) error { return fmt.Errorf("retain %s: %w", hashName(key), err) }
	if err := invocation.CheckRetention(retention); err != nil {
		return fail(err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.isPending != nil && s.isPending(key) {
		return fail(fmt.Errorf("message %s is still pending in %s group %s: its state is live", key.MessageID, key.Stream, key.Group))
	}
	s.retainLocked(key, retention, nowMS(s.clock))
	return nil
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

// Unfinished implements relay.StateStore.Unfinished as invocation.Store
// does: the fields that are running, waiting for a retry (recorded ones
// included) or exhausted without a recorded DLQ entry, sorted, and whether
// the first delivery's record is complete; nothing once retained.
func (s *StateStore) Unfinished(ctx context.Context, key invocation.Key) (invocation.Unfinished, error) {
	if err := ctx.Err(); err != nil {
		return invocation.Unfinished{}, fmt.Errorf("unfinished %s: %w", hashName(key), err)
	}
	return invocation.UnfinishedOf(s.Get(key)), nil
}

// Get returns every field of the hash of key as invocation.Store.Get does:
// invocation fields with values in invocation.Store's wire form
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

// transition runs one fenced write: after the checks invocation.Store makes
// in Go, it returns ErrTerminal on a retained hash or when the message is
// not pending (WithPending), and ErrStale unless the
// field has kind want with l's attempt and token, and otherwise calls apply
// with the current value and time.
func (s *StateStore) transition(ctx context.Context, op string, l invocation.Lease, want stateKind, apply func(h *stateHash, v stateValue, nowMS int64)) error {
	return s.fenced(ctx, op, l, l, func(h *stateHash, now int64) error {
		if h == nil {
			return invocation.ErrStale
		}
		v, ok := h.fields[l.Field]
		if !ok || v.kind != want || v.attempt != l.Attempt || v.token != l.Token {
			return invocation.ErrStale
		}
		apply(h, v, now)
		return nil
	})
}

// fenced checks check as invocation.Store checks a lease in Go and, under
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
