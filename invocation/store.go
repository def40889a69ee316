package invocation

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/combine"
	"github.com/relaydev/relay/internal/keys"
)

// terminalField is the reserved hash field that marks a retained hash.
const terminalField = "__terminal"

// matchedField is the reserved hash field that says the first delivery
// recorded every invocation of the message (Record.Complete).
const matchedField = "__matched"

// tracePrefix starts the reserved field holding an invocation's trace
// lineage (prelude.lua save_trace).
const tracePrefix = "__trace:"

// TraceField returns the reserved hash field that holds the trace lineage
// of invocation field ("<app>/<handler>"): "__trace:<app>/<handler>". It is
// written by Release, ScheduleRetry and Exhaust from Lease.Trace. Code that
// reads the whole hash (Get) must skip every field starting with "__": those
// are not invocations.
func TraceField(field string) string { return tracePrefix + field }

// Store keeps per-invocation retry state in Redis, one hash per message and
// one field per invocation, and implements relay.StateStore. Every method is
// a single Lua script run atomically on the server, so a Store is safe for
// concurrent use, and so are several Stores (on several hosts) sharing a
// server.
type Store struct {
	client   rueidis.Client
	token    func() string
	maxBatch int
	cluster  bool
	claims   *combine.Combiner[string, claimItem, reply]
	settles  *combine.Combiner[settleGroup, settleItem, int64]
}

// Option configures a Store.
type Option func(*Store)

// WithTokenSource replaces the generator of claim tokens, for tests that
// assert stored values. f must be safe for concurrent use and return a
// non-empty string without ':' that no earlier claim of the same message
// used (a claim that finds its own token stored takes itself for voided:
// Void). A nil f is ignored. Default: 16 random bytes (crypto/rand), hex-encoded.
func WithTokenSource(f func() string) Option {
	return func(s *Store) {
		if f != nil {
			s.token = f
		}
	}
}

// New returns a Store on client, a ready client that the Store never closes.
func New(client rueidis.Client, opts ...Option) *Store {
	s := &Store{client: client, token: randomToken, maxBatch: DefaultMaxBatch}
	for _, o := range opts {
		o(s)
	}
	s.initBatches()
	return s
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error (Go 1.24+)
	return hex.EncodeToString(b)
}

// Claim decides whether this delivery may run a new attempt of the
// invocation field ("<app>/<handler>") of message key, and records the claim
// when it may (claim.lua):
//
//   - no state: attempt 1 is Claimed, running until now+lease;
//
//   - running with a live lease: Running, with RunningUntil;
//
//   - running with an expired lease: the owner died mid-run, so that attempt
//     counts as executed and failed (Lost), and the next attempt is Claimed,
//     or Exhausted when it was the last;
//
//   - next_attempt_at in the future: NotDue, with NextAttemptAt;
//
//   - next_attempt_at due: the next attempt is Claimed;
//
//   - "ok": Succeeded; exhausted: Exhausted or DeadLettered, with the
//     exhausted attempt and its token in Lease;
//
//   - __terminal set: Terminal, and nothing changes.
//
//   - the message is no longer in key.Group's PEL (acknowledged, or its
//     reference cleared): Terminal, and nothing changes, whatever the hash
//     holds (docs/delivery.md#invocation-state).
//
// Claimed, Exhausted and DeadLettered carry PrevTrace, the lineage the
// latest unsuccessful attempt stored (Lease.Trace).
//
// When the attempt to claim would exceed maxAttempts (the rule's retries
// plus one), Claim stores exhausted:<attempt>:<token> instead and returns
// Exhausted, so the caller writes the DLQ entry without running the handler.
//
// rec, given by a message's first delivery, records the message's other
// invocations in the same script (see Record); it must not name field or a
// reserved "__" field.
// now is the Redis server's clock; lease must be at least 1ms and is used
// with millisecond precision. A malformed stored value is an error; the
// caller must then not run the handler.
func (s *Store) Claim(ctx context.Context, key Key, field string, lease time.Duration, maxAttempts int, rec Record) (Claim, error) {
	hash := hashOf(key)
	fail := func(err error) (Claim, error) {
		return Claim{}, fmt.Errorf("claim %s in %s: %w", field, hash, err)
	}
	token := s.token()
	args, err := s.claimArgs(key, field, lease, maxAttempts, rec, token)
	if err != nil {
		return fail(err)
	}
	r, err := s.claims.Do(ctx, s.claimGroup(key.Stream, hash), claimItem{hash: hash, stream: key.Stream, args: args})
	if err != nil {
		if replyLost(err) {
			err = &ClaimUnknownError{Lease: Lease{Key: key, Field: field, Token: token}, Err: err}
		}
		return fail(err)
	}
	c, err := claimOf(r, Lease{Key: key, Field: field}, token)
	if err != nil {
		return fail(err)
	}
	return c, nil
}

// claimArgs checks Claim's arguments and returns its segment of
// claim.lua's ARGV.
func (s *Store) claimArgs(key Key, field string, lease time.Duration, maxAttempts int, rec Record, token string) ([]string, error) {
	if err := CheckClaim(field, lease, maxAttempts); err != nil {
		return nil, err
	}
	if err := CheckRecord(field, rec); err != nil {
		return nil, err
	}
	if err := CheckToken(token); err != nil {
		return nil, err
	}
	if err := s.checkKeys(key); err != nil {
		return nil, err
	}
	complete := "0"
	if rec.Complete {
		complete = "1"
	}
	args := make([]string, 0, 8+len(rec.Fields))
	args = append(args, field, strconv.FormatInt(lease.Milliseconds(), 10), token, strconv.Itoa(maxAttempts),
		complete, key.Group, key.MessageID, strconv.Itoa(len(rec.Fields)))
	return append(args, rec.Fields...), nil
}

// claimOf reads one claim's reply r: base is the lease of the claimed
// field and token the claim's.
func claimOf(r reply, base Lease, token string) (Claim, error) {
	var c Claim
	switch r.code {
	case claimFirst:
		c.Status, c.Lease = Claimed, base
		c.Lease.Attempt, c.Lease.Token, c.Lease.Deadline = 1, token, time.UnixMilli(r.int(1))
	case claimClaimed:
		c.Status, c.Lease = Claimed, base
		c.Lease.Attempt, c.Lease.Token, c.Lease.Deadline = int(r.int(1)), token, time.UnixMilli(r.int(2))
		c.PrevTrace, c.Lost = r.str(3), int(r.int(4))
	case claimRunning:
		c.Status, c.RunningUntil = Running, time.UnixMilli(r.int(1))
	case claimNotDue:
		c.Status, c.NextAttemptAt = NotDue, time.UnixMilli(r.int(1))
	case claimSucceeded:
		c.Status = Succeeded
	case claimExhausted, claimDeadLettered:
		c.Status, c.Lease = Exhausted, base
		if r.code == claimDeadLettered {
			c.Status = DeadLettered
		}
		c.Lease.Attempt, c.Lease.Token, c.PrevTrace = int(r.int(1)), r.str(2), r.str(3)
		if r.code == claimExhausted { // not 0 only when this claim exhausted the invocation
			c.Lost = int(r.int(4))
		}
	case claimTerminal:
		c.Status = Terminal
	case claimVoided:
		// Only a claim whose caller gave it up for lost gets here, and
		// that caller no longer reads the reply.
		return Claim{}, errors.New("claim voided before it ran: its token was given back (Void)")
	case claimMalformed:
		v := r.str(1)
		if r.err == nil {
			return Claim{}, fmt.Errorf("malformed state %q", v)
		}
	default:
		return Claim{}, r.unknown()
	}
	if r.err != nil {
		return Claim{}, r.err
	}
	return c, nil
}

// replyLost reports whether err, from a script call, leaves it unknown
// whether the script ran: anything but a reply of the server's (an error
// reply, such as OOM or NOSCRIPT, means it did not run, or ran to its end).
func replyLost(err error) bool {
	_, isRedis := rueidis.IsRedisErr(err)
	return !isRedis
}

// Void gives back a claim whose reply was lost (void.lua): the caller
// knows only l.Key, l.Field and l.Token (from the ClaimUnknownError), not
// whether the claim ran, nor, so, its attempt (l.Attempt is ignored). When
// the claim ran and the field is still running with its token, the attempt
// is given back uncharged, as Release does; when it has not run (it may
// still be on its way, held up in the network), the field is marked with
// its token, due and with its count unchanged (next_attempt_at:<now>:0:<token>
// when it had no state), so that the claim, if it arrives later, finds its
// own token and records nothing. Anything else (another delivery's lease,
// "ok", exhausted) is left alone and nil returned. Idempotent, so retry it
// until it returns; ErrTerminal on a retained hash or once the message
// left the group's PEL, when there is nothing to give back either
// (docs/delivery.md#lost-replies).
func (s *Store) Void(ctx context.Context, l Lease) error {
	hash := hashOf(l.Key)
	fail := func(err error) error { return fmt.Errorf("void claim %s of %s in %s: %w", l.Token, l.Field, hash, err) }
	if err := checkField(l.Field); err != nil {
		return fail(err)
	}
	if err := CheckToken(l.Token); err != nil {
		return fail(err)
	}
	if err := s.checkKeys(l.Key); err != nil {
		return fail(err)
	}
	r, err := decode(voidScript.Exec(ctx, s.client, []string{hash, l.Key.Stream}, []string{l.Field, l.Token, l.Key.Group, l.Key.MessageID}))
	if err != nil {
		return fail(err)
	}
	switch r.code {
	case codeApplied, codeAlready:
		return nil
	case codeTerminal:
		return fail(ErrTerminal)
	}
	return fail(r.unknown())
}

// Release gives a claimed attempt back without charging it, for a runtime
// that was unavailable or a worker shutting down (release.lua). The field
// becomes next_attempt_at:<now>:<attempt-1>:<token>, due at once, so the
// next Claim runs the same attempt number; for attempt 1 (0 used) too, so
// that Unfinished still lists the invocation. A non-empty l.Trace is stored in
// TraceField(l.Field) either way. ErrStale unless the field is running with
// l's attempt and token; ErrTerminal on a retained hash or once the
// message left the group's PEL.
func (s *Store) Release(ctx context.Context, l Lease) error {
	_, err := s.transition(ctx, "release", releaseScript, l, l.Trace)
	return err
}

// Finish records success: the field becomes "ok" (finish.lua). ErrStale
// unless the field is running with l's attempt and token, including when it
// is "ok" already (Finish is not idempotent: "ok" carries no token, so a
// caller that lost the reply learns the outcome from Claim, which reports
// Succeeded). ErrTerminal on a retained hash or once the message left the
// group's PEL.
func (s *Store) Finish(ctx context.Context, l Lease) error {
	_, err := s.transition(ctx, "finish", finishScript, l)
	return err
}

// FinishSettle records the success of the last unfinished invocation of a
// message, acknowledges the message in its group (XACK) and applies the
// retention of its hash, all in one script (finish_settle.lua): Finish,
// then the acknowledgement and Retain, without a round trip or a crash
// between them. retention is CheckRetention's: 0 deletes the hash in that
// script, so none outlives the XACK; otherwise the field becomes "ok" and
// the hash gets __terminal and a TTL of retention. The caller must know
// every other invocation of the message is terminal. ErrStale unless the
// field is running with l's attempt and token, and then nothing is
// acknowledged; ErrTerminal on a retained hash or when the message is no
// longer in the group's PEL. Under Redis Cluster the stream and the hash
// must share a hash slot (a stream name with a hash tag).
func (s *Store) FinishSettle(ctx context.Context, l Lease, retention time.Duration) error {
	g, it, err := s.settleItemOf(l, retention)
	if err == nil {
		var code int64
		code, err = s.settles.Do(ctx, g, it)
		err = settleResult(code, err)
	}
	return wrapSettle(l, err)
}

// FinishSettleBatch is FinishSettle for each of ls, in as few script
// calls as WithMaxBatch allows, sent together: leases of one stream and
// group (and, under Redis Cluster, one hash slot) go together. It returns one error per
// lease, in ls's order, each FinishSettle's; a failed call fails the
// leases it carried. Under Redis Cluster a stream's hashes share its slot
// (checkKeys), so a group is one slot. It implements relay.BatchSettler.
func (s *Store) FinishSettleBatch(ctx context.Context, ls []Lease, retention time.Duration) []error {
	errs := make([]error, len(ls))
	type pos struct {
		items []settleItem
		at    []int
	}
	groups := map[settleGroup]*pos{}
	var order []settleGroup
	for i, l := range ls {
		g, it, err := s.settleItemOf(l, retention)
		if err != nil {
			errs[i] = wrapSettle(l, err)
			continue
		}
		p := groups[g]
		if p == nil {
			p = &pos{}
			groups[g] = p
			order = append(order, g)
		}
		p.items = append(p.items, it)
		p.at = append(p.at, i)
	}
	var chunks []func()
	for _, g := range order {
		p := groups[g]
		for from := 0; from < len(p.items); from += s.maxBatch {
			to := min(from+s.maxBatch, len(p.items))
			chunks = append(chunks, func() {
				for k, r := range s.runSettles(ctx, g, p.items[from:to]) {
					i := p.at[from+k]
					errs[i] = wrapSettle(ls[i], settleResult(r.Value, r.Err))
				}
			})
		}
	}
	// The chunks go at once: the client pipelines concurrent calls, so
	// several chunks cost one round trip, not one each. The last runs
	// here, so a batch of one chunk (a read's) starts no goroutine.
	var wg sync.WaitGroup
	for i, run := range chunks {
		if i == len(chunks)-1 {
			run()
		} else {
			wg.Go(run)
		}
	}
	wg.Wait()
	return errs
}

// settleItemOf checks l and retention and returns l's batch and item of
// finish_settle.lua.
func (s *Store) settleItemOf(l Lease, retention time.Duration) (settleGroup, settleItem, error) {
	if err := l.Check(); err != nil {
		return settleGroup{}, settleItem{}, err
	}
	if err := s.checkKeys(l.Key); err != nil {
		return settleGroup{}, settleItem{}, err
	}
	if err := CheckRetention(retention); err != nil {
		return settleGroup{}, settleItem{}, err
	}
	g := settleGroup{stream: l.Key.Stream, group: l.Key.Group, ttl: retentionArg(retention)}
	return g, settleItem{hash: hashOf(l.Key), args: [4]string{l.Field, strconv.Itoa(l.Attempt), l.Token, l.Key.MessageID}}, nil
}

// settleResult is the error of one finish_settle.lua reply code.
func settleResult(code int64, err error) error {
	switch {
	case err != nil:
		return err
	case code == codeApplied:
		return nil
	case code == codeStale:
		return ErrStale
	case code == codeTerminal:
		return ErrTerminal
	}
	return fmt.Errorf("unknown script reply code %d", code)
}

// wrapSettle names l's field and hash in a FinishSettle error.
func wrapSettle(l Lease, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("finish and settle %s in %s: %w", l.Field, hashOf(l.Key), err)
}

// ScheduleRetry records a failed attempt and the earliest time of the next
// one, now+backoff on the Redis server's clock, and returns that time
// (schedule_retry.lua): next_attempt_at:<time>:<attempt>:<token>, and a
// non-empty l.Trace in TraceField(l.Field). backoff must be >= 0 and is used
// with millisecond precision. ErrStale unless the field is running with l's
// attempt and token; ErrTerminal on a retained hash or once the message
// left the group's PEL.
func (s *Store) ScheduleRetry(ctx context.Context, l Lease, backoff time.Duration) (time.Time, error) {
	if backoff < 0 {
		return time.Time{}, fmt.Errorf("schedule_retry %s in %s: backoff %v: must be >= 0",
			l.Field, hashOf(l.Key), backoff)
	}
	r, err := s.transition(ctx, "schedule_retry", scheduleRetryScript, l,
		strconv.FormatInt(backoff.Milliseconds(), 10), l.Trace)
	if err != nil {
		return time.Time{}, err
	}
	nextMS := r.int(1)
	if r.err != nil {
		return time.Time{}, fmt.Errorf("schedule_retry %s in %s: %w", l.Field, hashOf(l.Key), r.err)
	}
	return time.UnixMilli(nextMS), nil
}

// Exhaust records a failed last attempt: exhausted:<attempt>:<token>
// (exhaust.lua), and a non-empty l.Trace in TraceField(l.Field). The caller
// then writes the DLQ entry and calls MarkDLQ with the same lease. ErrStale
// unless the field is running with l's attempt and token; ErrTerminal on a
// retained hash or once the message left the group's PEL.
func (s *Store) Exhaust(ctx context.Context, l Lease) error {
	_, err := s.transition(ctx, "exhaust", exhaustScript, l, l.Trace)
	return err
}

// MarkDLQ records that the DLQ entry of an exhausted invocation is persisted:
// exhausted:<attempt>:<token>:dlq (mark_dlq.lua). Idempotent: a field
// already marked with l's attempt and token is left as is and nil returned.
// ErrStale unless the field is exhausted with l's attempt and token;
// ErrTerminal on a retained hash or once the message left the group's PEL.
func (s *Store) MarkDLQ(ctx context.Context, l Lease) error {
	_, err := s.transition(ctx, "mark_dlq", markDLQScript, l)
	return err
}

// Retain applies the retention of message key's hash after the message
// left the PEL (retain.lua): with retention 0 the hash is deleted;
// otherwise it gets __terminal and a TTL of retention (millisecond
// precision), a running TTL being kept (a repeated Retain cannot extend
// it). retention is CheckRetention's. A missing hash stays missing: a
// stale delivery is inert without it, since every transition checks that
// the message is still in the group's PEL. A message still pending is left
// alone and an error returned: its state is live. Idempotent. No other
// method removes a TTL; only Settle, FinishSettle and RetainAcked (for a
// leaked hash) also apply the retention.
func (s *Store) Retain(ctx context.Context, key Key, retention time.Duration) error {
	hash := hashOf(key)
	fail := func(err error) error { return fmt.Errorf("retain %s: %w", hash, err) }
	if err := s.checkKeys(key); err != nil {
		return fail(err)
	}
	if err := CheckRetention(retention); err != nil {
		return fail(err)
	}
	r, err := decode(retainScript.Exec(ctx, s.client, []string{hash, key.Stream}, []string{key.Group, key.MessageID, retentionArg(retention)}))
	if err != nil {
		return fail(err)
	}
	switch r.code {
	case codeApplied, codeAlready, codeMissing:
		return nil
	case codePending:
		return fail(fmt.Errorf("message %s is still pending in %s group %s: its state is live", key.MessageID, key.Stream, key.Group))
	}
	return fail(r.unknown())
}

// Settle acknowledges message key.MessageID in consumer group key.Group of
// stream key.Stream (XACK) and applies the retention of its hash as Retain
// does, in one script (settle.lua): with retention 0 the hash is deleted
// with the XACK, so none is left behind. Call it where XACK would be
// called followed by Retain: once every invocation of the message is
// terminal (docs/delivery.md#invocation-state). A message no longer in the
// group's PEL was settled already (by another delivery) or its reference
// cleared: nothing changes and both errors are nil. retention is
// CheckRetention's. Under Redis Cluster the stream and the hash must share
// a hash slot (a stream name with a hash tag, docs/deployment.md).
//
// ackErr is the script's error; nothing is acknowledged then. retainErr
// is always nil: the retention cannot fail apart from the XACK.
// Idempotent, like XACK and Retain.
func (s *Store) Settle(ctx context.Context, key Key, retention time.Duration) (ackErr, retainErr error) {
	hash := hashOf(key)
	fail := func(err error) error {
		return fmt.Errorf("ack and retain %s in %s group %s: %w", key.MessageID, key.Stream, key.Group, err)
	}
	if err := s.checkKeys(key); err != nil {
		return fail(err), nil
	}
	if err := CheckRetention(retention); err != nil {
		return fail(err), nil
	}
	r, err := decode(settleScript.Exec(ctx, s.client, []string{hash, key.Stream}, []string{key.Group, key.MessageID, retentionArg(retention)}))
	if err != nil {
		return fail(err), nil
	}
	switch r.code {
	case codeApplied, codeTerminal:
		return nil, nil
	}
	return fail(r.unknown()), nil
}

// CheckRetention reports whether retention is one a Store applies: 0
// deletes a message's state when it leaves the PEL, a positive value (>=
// 1ms, millisecond precision) keeps it that long. Every StateStore refuses
// what it refuses.
func CheckRetention(retention time.Duration) error {
	if retention != 0 && retention < time.Millisecond {
		return fmt.Errorf("retention %v: must be 0 (delete) or >= 1ms", retention)
	}
	return nil
}

func retentionArg(retention time.Duration) string {
	return strconv.FormatInt(retention.Milliseconds(), 10)
}

// checkKeys reports, under Redis Cluster, a stream whose invocation hashes
// are in another hash slot: every script touches both
// (docs/deployment.md#redis-cluster-one-hash-slot-per-stream).
func (s *Store) checkKeys(k Key) error {
	if s.cluster && keys.Slot(k.Stream) != keys.Slot(hashOf(k)) {
		return fmt.Errorf("stream %q has no hash tag, so under Redis Cluster its invocation hashes are in other hash slots (docs/deployment.md); name it with a tag such as {%s}", k.Stream, k.Stream)
	}
	return nil
}

// Client returns the Redis client the Store uses, so that a caller can
// tell whether another component talks to the same server (the Engine
// pairs the Store with a stream.Source on the same client as its Settler).
func (s *Store) Client() rueidis.Client { return s.client }

// Pin stores value in the reserved field of key's hash unless it holds a
// value already, and returns the value that holds now: the first writer
// wins and every later caller adopts its value (pin.lua). field must start
// with "__" and must be neither "__terminal" nor a trace field
// ("__trace:..."). ErrTerminal on a retained hash or when the message is
// no longer in the group's PEL. Retrying is safe: a lost reply's write is
// read back as the pin.
func (s *Store) Pin(ctx context.Context, key Key, field, value string) (string, error) {
	hash := hashOf(key)
	if !strings.HasPrefix(field, "__") || field == terminalField || strings.HasPrefix(field, tracePrefix) || len(field) < 3 {
		return "", fmt.Errorf("pin %s in %s: field must be a reserved \"__<name>\" other than __terminal and __trace:*", field, hash)
	}
	if err := s.checkKeys(key); err != nil {
		return "", fmt.Errorf("pin %s in %s: %w", field, hash, err)
	}
	r, err := decode(pinScript.Exec(ctx, s.client, []string{hash, key.Stream}, []string{field, value, key.Group, key.MessageID}))
	if err != nil {
		return "", fmt.Errorf("pin %s in %s: %w", field, hash, err)
	}
	switch r.code {
	case codeApplied, codeAlready:
		v := r.str(1)
		if r.err != nil {
			return "", fmt.Errorf("pin %s in %s: %w", field, hash, r.err)
		}
		return v, nil
	case codeTerminal:
		return "", fmt.Errorf("pin %s in %s: %w", field, hash, ErrTerminal)
	}
	return "", fmt.Errorf("pin %s in %s: %w", field, hash, r.unknown())
}

// Get returns every field of the hash of message key (HGETALL), reserved
// fields ("__terminal", "__schedule", "__trace:<field>") included, for
// diagnostics; an empty map when there is none.
func (s *Store) Get(ctx context.Context, key Key) (map[string]string, error) {
	hash := hashOf(key)
	m, err := s.client.Do(ctx, s.client.B().Hgetall().Key(hash).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", hash, err)
	}
	return m, nil
}

// Unfinished returns, sorted, the invocation fields ("<app>/<handler>") of
// message key whose state is not final: running, waiting for a retry
// (recorded ones included), or exhausted without a recorded DLQ entry
// (HGETALL, then read here), and whether the first delivery recorded every
// invocation of the message (Record.Complete, the __matched field). Nothing
// for a retained (terminal) hash or when there is no hash. A value this
// package does not recognise counts as unfinished, so that the Claim that
// follows reports it instead of the message being acknowledged.
func (s *Store) Unfinished(ctx context.Context, key Key) (Unfinished, error) {
	m, err := s.Get(ctx, key)
	if err != nil {
		return Unfinished{}, fmt.Errorf("unfinished: %w", err)
	}
	return UnfinishedOf(m), nil
}

// UnfinishedOf reads Unfinished from the fields of a message's hash, as
// Store.Unfinished does; other StateStores call it on their own copy.
func UnfinishedOf(m map[string]string) Unfinished {
	if _, ok := m[terminalField]; ok {
		return Unfinished{}
	}
	var u Unfinished
	for f, v := range m {
		if strings.HasPrefix(f, "__") || v == "ok" || (strings.HasPrefix(v, "exhausted:") && strings.HasSuffix(v, ":dlq")) {
			continue
		}
		u.Fields = append(u.Fields, f)
	}
	slices.Sort(u.Fields)
	u.Complete = m[matchedField] == "1"
	return u
}

// transition runs one fenced script on l with the keys hash and stream and
// the arguments field, attempt, token, extra, group and message id, and
// maps the shared reply codes.
func (s *Store) transition(ctx context.Context, op string, sc *rueidis.Lua, l Lease, extra ...string) (reply, error) {
	hash := hashOf(l.Key)
	fail := func(err error) (reply, error) {
		return reply{}, fmt.Errorf("%s %s in %s: %w", op, l.Field, hash, err)
	}
	if err := l.Check(); err != nil {
		return fail(err)
	}
	if err := s.checkKeys(l.Key); err != nil {
		return fail(err)
	}
	args := append(append([]string{l.Field, strconv.Itoa(l.Attempt), l.Token}, extra...), l.Key.Group, l.Key.MessageID)
	r, err := decode(sc.Exec(ctx, s.client, []string{hash, l.Key.Stream}, args))
	if err != nil {
		return fail(err)
	}
	switch r.code {
	case codeApplied:
		return r, nil
	case codeStale:
		return fail(ErrStale)
	case codeTerminal:
		return fail(ErrTerminal)
	case codeAlready: // an idempotent no-op; only mark_dlq.lua replies it
		if sc == markDLQScript {
			return r, nil
		}
	}
	return fail(r.unknown())
}

func hashOf(k Key) string { return keys.Invocation(k.Stream, k.Group, k.MessageID) }

// CheckRecord reports whether rec may go with a Claim of field: its fields
// non-empty, without the reserved "__" prefix, other than field and each
// other. Every StateStore refuses what it refuses.
func CheckRecord(field string, rec Record) error {
	seen := map[string]bool{field: true}
	for _, f := range rec.Fields {
		if f == "" || strings.HasPrefix(f, "__") || seen[f] {
			return fmt.Errorf("record %q: a recorded field must be non-empty, not reserved, and listed once, not the claimed field", f)
		}
		seen[f] = true
	}
	return nil
}

// CheckClaim reports whether Claim's arguments are well-formed: field
// non-empty and without the reserved "__" prefix, lease >= 1 ms,
// maxAttempts >= 1. Every StateStore refuses what it refuses, with its
// error wrapped; other implementations (relaytest's) call it for that.
func CheckClaim(field string, lease time.Duration, maxAttempts int) error {
	if err := checkField(field); err != nil {
		return err
	}
	if lease < time.Millisecond {
		return fmt.Errorf("lease %v: must be >= 1ms", lease)
	}
	if maxAttempts < 1 {
		return fmt.Errorf("max attempts %d: must be >= 1", maxAttempts)
	}
	return nil
}

func checkField(field string) error {
	switch {
	case field == "":
		return errors.New("empty field")
	case strings.HasPrefix(field, "__"):
		return fmt.Errorf("field %q: the __ prefix is reserved", field)
	}
	return nil
}

// CheckToken reports whether token can fence a lease: non-empty, without
// ':' (the separator of a lease's hash value).
func CheckToken(token string) error {
	if token == "" || strings.Contains(token, ":") {
		return fmt.Errorf("token %q: must be non-empty without ':'", token)
	}
	return nil
}

// Check reports whether l is well-formed for a transition: a field as
// CheckClaim wants it, Attempt >= 1 and a token as CheckToken wants it.
// Every StateStore refuses a malformed lease before touching state.
func (l Lease) Check() error {
	if err := checkField(l.Field); err != nil {
		return err
	}
	if l.Attempt < 1 {
		return fmt.Errorf("lease attempt %d: must be >= 1", l.Attempt)
	}
	return CheckToken(l.Token)
}

// reply is a decoded script reply {code, ...}. The accessors record the
// first decoding error in err, so a caller reads every element it needs and
// checks err once.
type reply struct {
	code int64
	arr  []rueidis.RedisMessage
	err  error
}

// decode reads a script reply {code, ...}.
func decode(res rueidis.RedisResult) (reply, error) {
	m, err := res.ToMessage()
	if err != nil {
		return reply{}, err
	}
	return decodeMessage(m)
}

// decodeMessage reads one reply {code, ...} of a script.
func decodeMessage(m rueidis.RedisMessage) (reply, error) {
	arr, err := m.ToArray()
	if err != nil {
		return reply{}, err
	}
	if len(arr) == 0 {
		return reply{}, errors.New("empty script reply")
	}
	code, err := arr[0].AsInt64()
	if err != nil {
		return reply{}, fmt.Errorf("script reply code: %w", err)
	}
	return reply{code: code, arr: arr}, nil
}

func (r *reply) int(i int) int64 {
	if r.err != nil {
		return 0
	}
	if i >= len(r.arr) {
		r.err = fmt.Errorf("script reply code %d: %d elements, want more than %d", r.code, len(r.arr), i)
		return 0
	}
	n, err := r.arr[i].AsInt64()
	if err != nil {
		r.err = fmt.Errorf("script reply code %d element %d: %w", r.code, i, err)
	}
	return n
}

func (r *reply) str(i int) string {
	if r.err != nil {
		return ""
	}
	if i >= len(r.arr) {
		r.err = fmt.Errorf("script reply code %d: %d elements, want more than %d", r.code, len(r.arr), i)
		return ""
	}
	s, err := r.arr[i].ToString()
	if err != nil {
		r.err = fmt.Errorf("script reply code %d element %d: %w", r.code, i, err)
	}
	return s
}

func (r *reply) unknown() error {
	return fmt.Errorf("unknown script reply code %d", r.code)
}
