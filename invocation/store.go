package invocation

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
// non-empty string without ':' that no earlier claim of the same field used.
// A nil f is ignored. Default: 16 random bytes (crypto/rand), hex-encoded.
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
//   - running with a live lease: Running, with RunningUntil;
//   - running with an expired lease: the owner died mid-run, so that attempt
//     counts as executed and failed (Lost), and the next attempt is Claimed,
//     or Exhausted when it was the last;
//   - next_attempt_at in the future: NotDue, with NextAttemptAt;
//   - next_attempt_at due: the next attempt is Claimed;
//   - "ok": Succeeded; exhausted: Exhausted or DeadLettered, with the
//     exhausted attempt and its token in Lease;
//   - __terminal set: Terminal, and nothing changes.
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
	hash := keys.Invocation(key.Stream, key.Group, key.MessageID)
	fail := func(err error) (Claim, error) {
		return Claim{}, fmt.Errorf("claim %s in %s: %w", field, hash, err)
	}
	if err := CheckClaim(field, lease, maxAttempts); err != nil {
		return fail(err)
	}
	if err := CheckRecord(field, rec); err != nil {
		return fail(err)
	}
	token := s.token()
	if err := CheckToken(token); err != nil {
		return fail(err)
	}
	complete := "0"
	if rec.Complete {
		complete = "1"
	}
	args := make([]string, 0, 6+len(rec.Fields))
	args = append(args, field, strconv.FormatInt(lease.Milliseconds(), 10), token, strconv.Itoa(maxAttempts),
		complete, strconv.Itoa(len(rec.Fields)))
	args = append(args, rec.Fields...)
	r, err := s.claims.Do(ctx, s.claimGroup(key.Stream, hash), claimItem{hash: hash, args: args})
	if err != nil {
		return fail(err)
	}
	base := Lease{Key: key, Field: field}
	switch r.code {
	case claimFirst:
		deadlineMS := r.int(1)
		if r.err != nil {
			return fail(r.err)
		}
		l := base
		l.Attempt, l.Token, l.Deadline = 1, token, time.UnixMilli(deadlineMS)
		return Claim{Status: Claimed, Lease: l}, nil
	case claimClaimed:
		attempt, deadlineMS, prev, lost := r.int(1), r.int(2), r.str(3), r.int(4)
		if r.err != nil {
			return fail(r.err)
		}
		l := base
		l.Attempt, l.Token, l.Deadline = int(attempt), token, time.UnixMilli(deadlineMS)
		return Claim{Status: Claimed, Lease: l, PrevTrace: prev, Lost: int(lost)}, nil
	case claimRunning:
		deadlineMS := r.int(1)
		if r.err != nil {
			return fail(r.err)
		}
		return Claim{Status: Running, RunningUntil: time.UnixMilli(deadlineMS)}, nil
	case claimNotDue:
		nextMS := r.int(1)
		if r.err != nil {
			return fail(r.err)
		}
		return Claim{Status: NotDue, NextAttemptAt: time.UnixMilli(nextMS)}, nil
	case claimSucceeded:
		return Claim{Status: Succeeded}, nil
	case claimExhausted, claimDeadLettered:
		attempt, tok, prev := r.int(1), r.str(2), r.str(3)
		var lost int64
		if r.code == claimExhausted { // not 0 only when this claim exhausted the invocation
			lost = r.int(4)
		}
		if r.err != nil {
			return fail(r.err)
		}
		l := base
		l.Attempt, l.Token = int(attempt), tok
		st := Exhausted
		if r.code == claimDeadLettered {
			st = DeadLettered
		}
		return Claim{Status: st, Lease: l, PrevTrace: prev, Lost: int(lost)}, nil
	case claimTerminal:
		return Claim{Status: Terminal}, nil
	case claimMalformed:
		v := r.str(1)
		if r.err != nil {
			return fail(r.err)
		}
		return fail(fmt.Errorf("malformed state %q", v))
	}
	return fail(r.unknown())
}

// Release gives a claimed attempt back without charging it, for a runtime
// that was unavailable or a worker shutting down (release.lua). The field
// becomes next_attempt_at:<now>:<attempt-1>:<token>, due at once, so the
// next Claim runs the same attempt number; for attempt 1 (0 used) too, so
// that Unfinished still lists the invocation. A non-empty l.Trace is stored in
// TraceField(l.Field) either way. ErrStale unless the field is running with
// l's attempt and token; ErrTerminal on a retained hash.
func (s *Store) Release(ctx context.Context, l Lease) error {
	_, err := s.transition(ctx, "release", releaseScript, l, l.Trace)
	return err
}

// Finish records success: the field becomes "ok" (finish.lua). ErrStale
// unless the field is running with l's attempt and token, including when it
// is "ok" already (Finish is not idempotent: "ok" carries no token, so a
// caller that lost the reply learns the outcome from Claim, which reports
// Succeeded). ErrTerminal on a retained hash.
func (s *Store) Finish(ctx context.Context, l Lease) error {
	_, err := s.transition(ctx, "finish", finishScript, l)
	return err
}

// FinishSettle records the success of the last unfinished invocation of a
// message (the field becomes "ok"), acknowledges the message in its group
// (XACK) and switches its hash to terminal retention with a TTL of ttl, all
// in one script (finish_settle.lua): Finish, then the acknowledgement and
// Retain, without a round trip or a crash between them. The caller must
// know every other invocation of the message is terminal. ErrStale unless
// the field is running with l's attempt and token, and then nothing is
// acknowledged; ErrTerminal on a retained hash. Under Redis Cluster the
// stream and the hash must share a hash slot (a stream name with a hash
// tag).
func (s *Store) FinishSettle(ctx context.Context, l Lease, ttl time.Duration) error {
	hash := hashOf(l.Key)
	fail := func(err error) error { return fmt.Errorf("finish and settle %s in %s: %w", l.Field, hash, err) }
	if err := l.Check(); err != nil {
		return fail(err)
	}
	if ttl < time.Millisecond {
		return fail(fmt.Errorf("ttl %v: must be >= 1ms", ttl))
	}
	g := settleGroup{stream: l.Key.Stream, group: l.Key.Group, ttl: strconv.FormatInt(ttl.Milliseconds(), 10)}
	code, err := s.settles.Do(ctx, g, settleItem{hash: hash, args: [4]string{l.Field, strconv.Itoa(l.Attempt), l.Token, l.Key.MessageID}})
	if err != nil {
		return fail(err)
	}
	switch code {
	case codeApplied:
		return nil
	case codeStale:
		return fail(ErrStale)
	case codeTerminal:
		return fail(ErrTerminal)
	}
	return fail(fmt.Errorf("unknown script reply code %d", code))
}

// ScheduleRetry records a failed attempt and the earliest time of the next
// one, now+backoff on the Redis server's clock, and returns that time
// (schedule_retry.lua): next_attempt_at:<time>:<attempt>:<token>, and a
// non-empty l.Trace in TraceField(l.Field). backoff must be >= 0 and is used
// with millisecond precision. ErrStale unless the field is running with l's
// attempt and token; ErrTerminal on a retained hash.
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
// retained hash.
func (s *Store) Exhaust(ctx context.Context, l Lease) error {
	_, err := s.transition(ctx, "exhaust", exhaustScript, l, l.Trace)
	return err
}

// MarkDLQ records that the DLQ entry of an exhausted invocation is persisted:
// exhausted:<attempt>:<token>:dlq (mark_dlq.lua). Idempotent: a field
// already marked with l's attempt and token is left as is and nil returned.
// ErrStale unless the field is exhausted with l's attempt and token;
// ErrTerminal on a retained hash.
func (s *Store) MarkDLQ(ctx context.Context, l Lease) error {
	_, err := s.transition(ctx, "mark_dlq", markDLQScript, l)
	return err
}

// Retain switches the hash of message key to terminal retention after the
// message left the PEL (retain.lua): it sets __terminal and a TTL of ttl
// (>= 1ms, millisecond precision). A missing hash is created with only the
// marker, so late transitions of stale deliveries stay inert. Idempotent:
// on a retained hash nothing changes, and the TTL already running is kept.
// No other method removes a TTL; only Settle, FinishSettle and RetainAcked (for a
// leaked hash) also set one.
func (s *Store) Retain(ctx context.Context, key Key, ttl time.Duration) error {
	hash := hashOf(key)
	if ttl < time.Millisecond {
		return fmt.Errorf("retain %s: ttl %v: must be >= 1ms", hash, ttl)
	}
	return retainReply(hash, retainScript.Exec(ctx, s.client, []string{hash}, []string{strconv.FormatInt(ttl.Milliseconds(), 10)}))
}

func retainReply(hash string, res rueidis.RedisResult) error {
	r, err := decode(res)
	if err != nil {
		return fmt.Errorf("retain %s: %w", hash, err)
	}
	switch r.code {
	case codeApplied, codeAlready:
		return nil
	}
	return fmt.Errorf("retain %s: %w", hash, r.unknown())
}

// retainSHA is the SHA1 digest of retain.lua as retainScript sends it
// (helpers included), for Settle's EVALSHA.
var retainSHA = func() string {
	sum := sha1.Sum([]byte(withHelpers(mustRead("retain.lua"))))
	return hex.EncodeToString(sum[:])
}()

// Settle acknowledges message key.MessageID in consumer group key.Group
// of stream key.Stream (XACK) and then switches the message's hash to
// terminal retention exactly as Retain does, in one round trip instead of
// two. Call it where XACK would be called followed by Retain: once every
// invocation of the message is terminal (docs/delivery.md#invocation-state).
//
// The two commands are pipelined on one connection, so Redis runs the
// retain after the XACK, never before it. Pipelining cannot make the retain
// depend on the XACK's reply: when the XACK fails with an error reply the
// retain has still run. The only such reply XACK gives is WRONGTYPE (Redis
// answers 0 for a missing stream, group or id): the key holds no stream,
// so no PEL holds the message any more and the retention still follows its
// leaving the PEL. Errors of the connection or of the server (LOADING,
// READONLY, OOM) fail both commands alike.
// Under Redis Cluster, when the stream and the hash are in different slots
// (the stream name has no hash tag), the two could reach different nodes
// in any order, so Settle sends the XACK and, after its reply, the
// retain. If Redis lost the script cache (NOSCRIPT), the retain is sent
// again as Retain sends it.
//
// ackErr is the XACK's error; nothing is acknowledged then. retainErr is
// the retain's, with the message acknowledged; Retain may be retried.
// Idempotent, like XACK and Retain.
func (s *Store) Settle(ctx context.Context, key Key, ttl time.Duration) (ackErr, retainErr error) {
	hash := hashOf(key)
	if ttl < time.Millisecond {
		err := fmt.Errorf("ack and retain %s: ttl %v: must be >= 1ms", hash, ttl)
		return err, err
	}
	b := s.client.B()
	xack := b.Xack().Key(key.Stream).Group(key.Group).Id(key.MessageID).Build().ToRetryable()
	retain := b.Evalsha().Sha1(retainSHA).Numkeys(1).Key(hash).Arg(strconv.FormatInt(ttl.Milliseconds(), 10)).Build().ToRetryable()
	if s.client.Mode() == rueidis.ClientModeCluster && xack.Slot() != retain.Slot() {
		if err := s.client.Do(ctx, xack).Error(); err != nil {
			return fmt.Errorf("ack %s in %s group %s: %w", key.MessageID, key.Stream, key.Group, err), nil
		}
		return nil, s.Retain(ctx, key, ttl)
	}
	res := s.client.DoMulti(ctx, xack, retain)
	if err := res[0].Error(); err != nil {
		return fmt.Errorf("ack %s in %s group %s: %w", key.MessageID, key.Stream, key.Group, err), nil
	}
	if e, ok := rueidis.IsRedisErr(res[1].Error()); ok && e.IsNoScript() {
		return nil, s.Retain(ctx, key, ttl)
	}
	return nil, retainReply(hash, res[1])
}

// Client returns the Redis client the Store uses, so that a caller can
// tell whether another component talks to the same server (the Engine
// pairs the Store with a stream.Source on the same client as its Settler).
func (s *Store) Client() rueidis.Client { return s.client }

// Pin stores value in the reserved field of key's hash unless it holds a
// value already, and returns the value that holds now: the first writer
// wins and every later caller adopts its value (pin.lua). field must start
// with "__" and must be neither "__terminal" nor a trace field
// ("__trace:..."). ErrTerminal on a retained hash. Retrying is safe: a lost
// reply's write is read back as the pin.
func (s *Store) Pin(ctx context.Context, key Key, field, value string) (string, error) {
	hash := hashOf(key)
	if !strings.HasPrefix(field, "__") || field == terminalField || strings.HasPrefix(field, tracePrefix) || len(field) < 3 {
		return "", fmt.Errorf("pin %s in %s: field must be a reserved \"__<name>\" other than __terminal and __trace:*", field, hash)
	}
	r, err := exec(ctx, s.client, pinScript, hash, field, value)
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

// transition runs one fenced script on l with the arguments field, attempt,
// token and then extra, and maps the shared reply codes.
func (s *Store) transition(ctx context.Context, op string, sc *rueidis.Lua, l Lease, extra ...string) (reply, error) {
	hash := hashOf(l.Key)
	fail := func(err error) (reply, error) {
		return reply{}, fmt.Errorf("%s %s in %s: %w", op, l.Field, hash, err)
	}
	if err := l.Check(); err != nil {
		return fail(err)
	}
	args := append([]string{l.Field, strconv.Itoa(l.Attempt), l.Token}, extra...)
	r, err := exec(ctx, s.client, sc, hash, args...)
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

func exec(ctx context.Context, c rueidis.Client, sc *rueidis.Lua, hash string, args ...string) (reply, error) {
	return decode(sc.Exec(ctx, c, []string{hash}, args))
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
