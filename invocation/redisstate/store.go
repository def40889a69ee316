package redisstate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/invocation"
)

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
}

// Option configures a Store.
type Option func(*Store)

// WithTokenSource replaces the generator of claim tokens, for tests that
// assert stored values. f must be safe for concurrent use and return a
// non-empty string without ':' that no earlier claim of the same message
// used (a claim that finds its own token stored takes itself for voided:
// Void). A nil f is ignored. Default: 16 random bytes (crypto/rand),
// hex-encoded.
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
	s.cluster = client.Mode() == rueidis.ClientModeCluster
	return s
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error (Go 1.24+)
	return hex.EncodeToString(b)
}

// Claim decides each of reqs (claim.lua) and returns one result per
// request, in order. For one request, whatever the hash holds:
//
//   - no state: attempt 1 is Claimed, running until now+Lease;
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
//   - the message is no longer in Key.Group's PEL (acknowledged, or its
//     reference cleared): Terminal, and nothing changes, whatever the hash
//     holds (docs/delivery.md#invocation-state).
//
// A Probe is decided the same way, but where a claim would take an
// attempt the field is recorded due now with its attempts unchanged and
// the status is Probed. Claimed, Exhausted and DeadLettered carry
// PrevTrace, the lineage the latest unsuccessful attempt stored
// (Lease.Trace). When the attempt to claim would exceed MaxAttempts,
// Claim stores exhausted:<attempt>:<token> instead and returns Exhausted,
// so the caller writes the DLQ entry without running the handler.
//
// Requests of one stream go in one script call (WithMaxBatch bounds its
// size; the calls of several streams, or chunks, are sent at once). now
// is the Redis server's clock. A malformed request or stored value is that
// request's error; the caller must then not run the handler. A call whose
// reply was lost fails each of its claims with a *ClaimUnknownError
// carrying its token (Void gives it back).
func (s *Store) Claim(ctx context.Context, reqs []invocation.ClaimRequest) []invocation.ClaimResult {
	out := make([]invocation.ClaimResult, len(reqs))
	tokens := make([]string, len(reqs))
	// The claims of each stream, which share its hash slot: a script call
	// under Redis Cluster touches one slot only.
	type group struct {
		stream string
		items  []claimItem
		at     []int
	}
	var groups []*group
	for i, r := range reqs {
		tokens[i] = s.token()
		args, err := s.claimArgs(r, tokens[i])
		if err != nil {
			out[i].Err = fmt.Errorf("claim %s in %s: %w", r.Field, hashOf(r.Key), err)
			continue
		}
		var g *group
		for _, h := range groups {
			if h.stream == r.Key.Stream {
				g = h
			}
		}
		if g == nil {
			g = &group{stream: r.Key.Stream}
			groups = append(groups, g)
		}
		g.items = append(g.items, claimItem{hash: hashOf(r.Key), stream: r.Key.Stream, args: args})
		g.at = append(g.at, i)
	}
	sizes := make([]int, len(groups))
	for k, g := range groups {
		sizes[k] = len(g.items)
	}
	s.chunks(sizes, func(k, from, to int) {
		g := groups[k]
		for j, res := range s.runClaims(ctx, g.items[from:to]) {
			i := g.at[from+j]
			out[i] = claimResult(res, reqs[i], tokens[i])
		}
	})
	return out
}

// claimResult reads one claim's reply.
func claimResult(res result, r invocation.ClaimRequest, token string) invocation.ClaimResult {
	fail := func(err error) invocation.ClaimResult {
		return invocation.ClaimResult{Err: fmt.Errorf("claim %s in %s: %w", r.Field, hashOf(r.Key), err)}
	}
	if res.err != nil {
		if replyLost(res.err) {
			return fail(&invocation.ClaimUnknownError{Lease: invocation.Lease{Key: r.Key, Field: r.Field, Token: token}, Err: res.err})
		}
		return fail(res.err)
	}
	c, err := claimOf(res.reply, invocation.Lease{Key: r.Key, Field: r.Field}, token)
	if err != nil {
		return fail(err)
	}
	return invocation.ClaimResult{Claim: c}
}

// chunks runs f(g, from, to) over [0, sizes[g]) of every group g (the
// items of one script call's keys: one stream's) in chunks of at most
// WithMaxBatch items, all at once: the client pipelines concurrent calls,
// so several chunks cost one round trip, not one each. The last chunk runs
// on the caller's goroutine, so a batch of one chunk starts none.
func (s *Store) chunks(sizes []int, f func(g, from, to int)) {
	var wg sync.WaitGroup
	var last func()
	for g, n := range sizes {
		for from := 0; from < n; from += s.maxBatch {
			if last != nil {
				wg.Go(last)
			}
			to := min(from+s.maxBatch, n)
			last = func() { f(g, from, to) }
		}
	}
	if last != nil {
		last()
	}
	wg.Wait()
}

// claimArgs checks r and returns its segment of claim.lua's ARGV.
func (s *Store) claimArgs(r invocation.ClaimRequest, token string) ([]string, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	if err := invocation.CheckToken(token); err != nil {
		return nil, err
	}
	if err := s.checkKeys(r.Key); err != nil {
		return nil, err
	}
	flags := ""
	if r.Record.Complete {
		flags += "c"
	}
	if r.Probe {
		flags += "p"
	}
	gated := !r.Probe && !r.Gate.IsZero()
	if gated {
		flags += "g"
	}
	if flags == "" {
		flags = "-"
	}
	args := make([]string, 0, 8+len(r.Record.Fields)+gateArgs)
	args = append(args, r.Field, strconv.FormatInt(r.Lease.Milliseconds(), 10), token, strconv.Itoa(r.MaxAttempts),
		flags, r.Key.Group, r.Key.MessageID, strconv.Itoa(len(r.Record.Fields)))
	args = append(args, r.Record.Fields...)
	if gated {
		g, k := r.Gate, r.Key
		limit := func(kind, key string, on bool) string {
			if !on {
				return ""
			}
			return keys.Limit(k.Stream, k.Group, kind, r.Field, key)
		}
		args = append(args,
			strconv.Itoa(g.Slots), limit("slots", g.SlotKey, g.Slots > 0),
			strconv.FormatInt(g.Interval.Microseconds(), 10), strconv.Itoa(g.Burst), limit("rate", g.RateKey, g.Interval > 0),
			strconv.FormatInt(g.Period.Milliseconds(), 10), limit("debounce", g.DebounceKey, g.Period > 0))
	}
	return args, nil
}

// gateArgs is how many arguments a claim's gate adds to its segment
// (claim.lua).
const gateArgs = 7

// transitionKey is the key settle.lua's transition t takes: for a
// DeadLetter the marker of its entry that the previous version of Relay
// wrote, so that a worker of this version taking over its pending work
// writes no second entry; for the others the slots key the transition
// gives its slot back to, or "" when its gate has none.
func transitionKey(k invocation.Key, t invocation.Transition) string {
	if t.Kind == invocation.DeadLetter {
		app, handler := invocation.SplitField(t.Lease.Field)
		return keys.LegacyDLQWritten(k.Stream, k.Group, k.MessageID, app, handler)
	}
	if t.Gate.Slots == 0 {
		return ""
	}
	return keys.Limit(k.Stream, k.Group, "slots", t.Lease.Field, t.Gate.SlotKey)
}

// claimOf reads one claim's reply r: base is the lease of the claimed
// field and token the claim's.
func claimOf(r reply, base invocation.Lease, token string) (invocation.Claim, error) {
	var c invocation.Claim
	switch r.code {
	case claimFirst:
		c.Status, c.Lease = invocation.Claimed, base
		c.Lease.Attempt, c.Lease.Token, c.Lease.Deadline = 1, token, time.UnixMilli(r.int(1))
	case claimClaimed:
		c.Status, c.Lease = invocation.Claimed, base
		c.Lease.Attempt, c.Lease.Token, c.Lease.Deadline = int(r.int(1)), token, time.UnixMilli(r.int(2))
		c.PrevTrace, c.Lost = r.str(3), int(r.int(4))
	case claimProbed:
		c.Status, c.Lease = invocation.Probed, base
		c.Lease.Attempt, c.Lease.Token, c.Lost = int(r.int(1)), token, int(r.int(2))
	case claimRunning:
		c.Status, c.RunningUntil, c.Lease = invocation.Running, time.UnixMilli(r.int(1)), base
		c.Lease.Attempt = int(r.int(2))
	case claimNotDue:
		c.Status, c.NextAttemptAt, c.Lease = invocation.NotDue, time.UnixMilli(r.int(1)), base
		c.Lease.Attempt = int(r.int(2))
	case claimThrottled:
		c.Status, c.NextAttemptAt = invocation.Throttled, time.UnixMicro(r.int(2))
		c.Limit = invocation.LimitRate
		if r.str(1) == "c" {
			c.Limit = invocation.LimitConcurrency
		}
	case claimDebounced:
		c.Status, c.NextAttemptAt = invocation.Debounced, time.UnixMilli(r.int(1))
	case claimSuperseded:
		c.Status, c.SupersededBy = invocation.Superseded, r.str(1)
	case claimSucceeded:
		c.Status = invocation.Succeeded
	case claimExhausted, claimDeadLettered:
		c.Status, c.Lease = invocation.Exhausted, base
		if r.code == claimDeadLettered {
			c.Status = invocation.DeadLettered
		}
		c.Lease.Attempt, c.Lease.Token, c.PrevTrace = int(r.int(1)), r.str(2), r.str(3)
		if r.code == claimExhausted { // not 0 only when this claim exhausted the invocation
			c.Lost = int(r.int(4))
		}
	case claimTerminal:
		c.Status = invocation.Terminal
	case claimNotPending:
		c.Status, c.NotPending = invocation.Terminal, true
	case claimVoided:
		// Only a claim whose caller gave it up for lost gets here, and
		// that caller no longer reads the reply.
		return invocation.Claim{}, errors.New("claim voided before it ran: its token was given back (Void)")
	case claimMalformed:
		v := r.str(1)
		if r.err == nil {
			return invocation.Claim{}, fmt.Errorf("malformed state %q", v)
		}
	default:
		return invocation.Claim{}, r.unknown()
	}
	if r.err != nil {
		return invocation.Claim{}, r.err
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

// Void gives back a claim whose reply was lost (void.lua): the caller knows
// only l.Key, l.Field and l.Token (from the invocation.ClaimUnknownError),
// not whether the claim ran, nor, so, its attempt (l.Attempt is ignored).
// When the claim ran and the field is still running with its token, the
// attempt is given back uncharged, as a Release transition does; when it has
// not run (it may still be on its way, held up in the network), the field is
// marked with its token, due and with its count unchanged
// (next_attempt_at:<now>:0:<token> when it had no state), so that the claim,
// if it arrives later, finds its own token and records nothing. Anything else
// (another delivery's lease, "ok", exhausted) is left alone and nil returned.
// Idempotent, so retry it until it returns; invocation.ErrTerminal on a
// retained hash or once the message left the group's PEL, when there is
// nothing to give back either (docs/delivery.md#lost-replies).
func (s *Store) Void(ctx context.Context, l invocation.Lease) error {
	hash := hashOf(l.Key)
	fail := func(err error) error { return fmt.Errorf("void claim %s of %s in %s: %w", l.Token, l.Field, hash, err) }
	if err := invocation.CheckField(l.Field); err != nil {
		return fail(err)
	}
	if err := invocation.CheckToken(l.Token); err != nil {
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
		return fail(invocation.ErrTerminal)
	}
	return fail(r.unknown())
}

// Settle applies each of ss atomically (settle.lua) and returns one result
// per settlement, in order: the transitions of its invocations, the
// dead-letter entries they write (to keys.DLQ of the stream, in the same
// step as their ":dlq" marker, so a redelivery or a retry after a lost
// reply never writes one twice), and, with Ack, the XACK and the
// retention of the message's state (the hash deleted with Retention 0, so
// nothing of it outlives the XACK; else __terminal and a TTL). A
// settlement one of whose transitions is stale returns invocation.ErrStale
// and changes nothing; one on a retained hash, or of a message no longer in
// its group's PEL, returns invocation.ErrTerminal and changes nothing
// (docs/delivery.md#invocation-state). Settlements of one stream and group go
// in one script call (WithMaxBatch bounds its size; the calls of several
// streams or groups, or chunks, are sent at once). A failed call fails every
// settlement it carried, which may or may not have applied. Under Redis
// Cluster the stream, its hashes and its dead-letter stream must share a hash
// slot (a stream name with a hash tag, docs/deployment.md).
func (s *Store) Settle(ctx context.Context, ss []invocation.Settlement) []invocation.SettleResult {
	out := make([]invocation.SettleResult, len(ss))
	type group struct {
		stream, group string
		items         []settleItem
		at            []int
	}
	var groups []*group
	for i, st := range ss {
		it, err := s.settleItemOf(st)
		if err != nil {
			out[i].Err = wrapSettle(st, err)
			continue
		}
		var g *group
		for _, h := range groups {
			if h.stream == st.Key.Stream && h.group == st.Key.Group {
				g = h
			}
		}
		if g == nil {
			g = &group{stream: st.Key.Stream, group: st.Key.Group}
			groups = append(groups, g)
		}
		g.items = append(g.items, it)
		g.at = append(g.at, i)
	}
	sizes := make([]int, len(groups))
	for k, g := range groups {
		sizes[k] = len(g.items)
	}
	s.chunks(sizes, func(k, from, to int) {
		g := groups[k]
		for j, res := range s.runSettles(ctx, g.stream, g.group, g.items[from:to]) {
			i := g.at[from+j]
			out[i] = settleResultOf(ss[i], res)
		}
	})
	return out
}

// settleItemOf checks st and returns its segment of settle.lua's ARGV.
func (s *Store) settleItemOf(st invocation.Settlement) (settleItem, error) {
	if err := st.Check(); err != nil {
		return settleItem{}, err
	}
	if err := s.checkKeys(st.Key); err != nil {
		return settleItem{}, err
	}
	flags := "-"
	switch {
	case st.Cleared:
		flags = "c"
	case st.Ack && len(st.Transitions) == 0 && st.Stateless:
		flags = "as"
	case st.Ack:
		flags = "a"
	}
	args := make([]string, 0, 4+7*len(st.Transitions))
	args = append(args, st.Key.MessageID, flags, retentionArg(st.Retention), strconv.Itoa(len(st.Transitions)))
	for _, t := range st.Transitions {
		backoff := "0"
		if t.Kind == invocation.Retry {
			backoff = strconv.FormatInt(t.Backoff.Milliseconds(), 10)
		}
		args = append(args, transitionCodes[t.Kind], t.Lease.Field, strconv.Itoa(t.Lease.Attempt), t.Lease.Token, t.Lease.Trace, backoff, transitionKey(st.Key, t))
		if t.Entry == nil {
			args = append(args, "0")
			continue
		}
		e := *t.Entry
		if e.OriginalStream == "" {
			e.OriginalStream = st.Key.Stream
		}
		if e.OriginalStream != st.Key.Stream {
			// The entry goes to the message's stream's DLQ, as
			// redisdlq.Writer.Write refuses an entry of another stream.
			return settleItem{}, fmt.Errorf("%s %s: dead-letter entry: %w", t.Kind, t.Lease.Field,
				&dlq.FieldError{Field: "original_stream", Msg: fmt.Sprintf("%q is not the message's stream %q", e.OriginalStream, st.Key.Stream)})
		}
		if e.Timestamp.IsZero() {
			e.Timestamp = time.Now()
		}
		if err := e.Validate(); err != nil {
			return settleItem{}, fmt.Errorf("%s %s: dead-letter entry: %w", t.Kind, t.Lease.Field, err)
		}
		pairs := dlq.EncodePairs(e)
		args = append(args, strconv.Itoa(len(pairs)/2))
		args = append(args, pairs...)
	}
	return settleItem{hash: hashOf(st.Key), args: args, n: len(st.Transitions), ack: st.Ack}, nil
}

// transitionCodes are settle.lua's names of the transitions.
var transitionCodes = [...]string{invocation.Finish: "f", invocation.Retry: "r", invocation.Exhaust: "x", invocation.DeadLetter: "d", invocation.Release: "l"}

// settleResultOf reads one settlement's reply.
func settleResultOf(st invocation.Settlement, res result) invocation.SettleResult {
	if res.err != nil {
		return invocation.SettleResult{Err: wrapSettle(st, res.err)}
	}
	r := res.reply
	switch r.code {
	case settleApplied:
	case settleStale:
		return invocation.SettleResult{Err: wrapSettle(st, invocation.ErrStale)}
	case settleTerminal:
		return invocation.SettleResult{Err: wrapSettle(st, invocation.ErrTerminal)}
	case settlePending:
		return invocation.SettleResult{Err: wrapSettle(st, fmt.Errorf("message %s is still pending in %s group %s: its state is live",
			st.Key.MessageID, st.Key.Stream, st.Key.Group))}
	default:
		return invocation.SettleResult{Err: wrapSettle(st, r.unknown())}
	}
	out := invocation.SettleResult{Transitions: make([]invocation.TransitionResult, len(st.Transitions))}
	for i, t := range st.Transitions {
		switch t.Kind {
		case invocation.Retry:
			out.Transitions[i].Next = time.UnixMilli(r.int(1 + i))
		case invocation.Exhaust, invocation.DeadLetter:
			out.Transitions[i].DLQID = r.str(1 + i)
		}
	}
	if r.err != nil {
		return invocation.SettleResult{Err: wrapSettle(st, r.err)}
	}
	return out
}

// wrapSettle names st's message in a Settle error.
func wrapSettle(st invocation.Settlement, err error) error {
	return fmt.Errorf("settle %s: %w", hashOf(st.Key), err)
}

func retentionArg(retention time.Duration) string {
	return strconv.FormatInt(retention.Milliseconds(), 10)
}

// checkKeys reports, under Redis Cluster, a stream whose invocation hashes
// or dead-letter stream are in another hash slot: the scripts touch them
// together
// (docs/deployment.md#redis-cluster-one-hash-slot-per-stream).
func (s *Store) checkKeys(k invocation.Key) error {
	if s.cluster && (keys.Slot(k.Stream) != keys.Slot(hashOf(k)) || keys.Slot(k.Stream) != keys.Slot(dlqKey(k.Stream))) {
		return fmt.Errorf("stream %q has no hash tag, so under Redis Cluster its invocation hashes are in other hash slots (docs/deployment.md); name it with a tag such as {%s}", k.Stream, k.Stream)
	}
	return nil
}

// Client returns the Redis client the Store uses, so that a caller can
// tell whether another component talks to the same server: Settle
// acknowledges on the stream of the messages it settles, so the Store must
// share the server of the redisstream.Source that reads them
// (docs/embedding.md#engine).
func (s *Store) Client() rueidis.Client { return s.client }

// Pin stores value in the reserved field of key's hash unless it holds a
// value already, and returns the value that holds now: the first writer
// wins and every later caller adopts its value (pin.lua). field must start
// with "__" and must be neither "__terminal" nor a trace field
// ("__trace:..."). invocation.ErrTerminal on a retained hash or when the
// message is no longer in the group's PEL. Retrying is safe: a lost reply's
// write is read back as the pin.
func (s *Store) Pin(ctx context.Context, key invocation.Key, field, value string) (string, error) {
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
		return "", fmt.Errorf("pin %s in %s: %w", field, hash, invocation.ErrTerminal)
	}
	return "", fmt.Errorf("pin %s in %s: %w", field, hash, r.unknown())
}

// Get returns every field of the hash of message key (HGETALL), reserved
// fields ("__terminal", "__schedule", "__trace:<field>") included, for
// diagnostics; an empty map when there is none.
func (s *Store) Get(ctx context.Context, key invocation.Key) (map[string]string, error) {
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
func (s *Store) Unfinished(ctx context.Context, key invocation.Key) (invocation.Unfinished, error) {
	m, err := s.Get(ctx, key)
	if err != nil {
		return invocation.Unfinished{}, fmt.Errorf("unfinished: %w", err)
	}
	return invocation.UnfinishedOf(m), nil
}

func hashOf(k invocation.Key) string { return keys.Invocation(k.Stream, k.Group, k.MessageID) }

// dlqKey is the dead-letter stream of stream, which Settle writes to.
func dlqKey(stream string) string { return keys.DLQ(stream) }

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
