package redisstate

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/invocation"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// testField is the invocation field every test uses.
const testField = "app/handler"

// env is one test's Store on the shared redis-server, with a key of its own:
// the messages of key and other are in their stream and pending in its
// group, as a delivery finds them.
type env struct {
	c     rueidis.Client
	s     *Store
	key   invocation.Key
	hash  string
	other invocation.Key // a second key of the same test, never seeded
}

// newEnv returns a Store whose claims all get token "new" (tok) or, when tok
// is empty, random tokens.
func newEnv(t *testing.T, tok string) *env {
	t.Helper()
	c := redistest.Client(t)
	var opts []Option
	if tok != "" {
		opts = append(opts, WithTokenSource(func() string { return tok }))
	}
	stream := redistest.Name(t, "stream")
	e := &env{
		c:     c,
		s:     New(c, opts...),
		key:   invocation.Key{Stream: stream, Group: "group", MessageID: "1700000000000-0"},
		other: invocation.Key{Stream: stream, Group: "group", MessageID: "1700000000000-1"},
	}
	e.hash = hashOf(e.key)
	ctx := t.Context()
	k := e.key
	cmds := rueidis.Commands{
		c.B().Xadd().Key(k.Stream).Id(k.MessageID).FieldValue().FieldValue("event", "{}").Build(),
		c.B().Xadd().Key(k.Stream).Id(e.other.MessageID).FieldValue().FieldValue("event", "{}").Build(),
		c.B().XgroupCreate().Key(k.Stream).Group(k.Group).Id("0").Build(),
		c.B().Xreadgroup().Group(k.Group, "c1").Count(2).Streams().Key(k.Stream).Id(">").Build(),
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			t.Fatalf("deliver the env's messages: %v", err)
		}
	}
	return e
}

// ack acknowledges key's message (XACK), as another worker would.
func (e *env) ack(t *testing.T, key invocation.Key) {
	t.Helper()
	if err := e.c.Do(t.Context(), e.c.B().Xack().Key(key.Stream).Group(key.Group).Id(key.MessageID).Build()).Error(); err != nil {
		t.Fatalf("XACK: %v", err)
	}
}

// nowMS reads the server clock (TIME) in Unix ms, the clock of the scripts.
func (e *env) nowMS(t *testing.T) int64 {
	t.Helper()
	parts, err := e.c.Do(t.Context(), e.c.B().Time().Build()).AsStrSlice()
	if err != nil || len(parts) != 2 {
		t.Fatalf("TIME: %v %v", parts, err)
	}
	sec, err1 := strconv.ParseInt(parts[0], 10, 64)
	usec, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("TIME: %v", parts)
	}
	return sec*1000 + usec/1000
}

// seed writes fields into the hash with HSET and, when ttl > 0, PEXPIREs it.
func (e *env) seed(t *testing.T, fields map[string]string, ttl time.Duration) {
	t.Helper()
	if len(fields) == 0 {
		return
	}
	cmd := e.c.B().Hset().Key(e.hash).FieldValue()
	for f, v := range fields {
		cmd = cmd.FieldValue(f, v)
	}
	if err := e.c.Do(t.Context(), cmd.Build()).Error(); err != nil {
		t.Fatalf("HSET: %v", err)
	}
	if ttl > 0 {
		if err := e.c.Do(t.Context(), e.c.B().Pexpire().Key(e.hash).Milliseconds(ttl.Milliseconds()).Build()).Error(); err != nil {
			t.Fatalf("PEXPIRE: %v", err)
		}
	}
}

// state returns the full hash (HGETALL) and its PTTL in ms (-1 no TTL,
// -2 no key).
func (e *env) state(t *testing.T) (map[string]string, int64) {
	t.Helper()
	ctx := t.Context()
	m, err := e.c.Do(ctx, e.c.B().Hgetall().Key(e.hash).Build()).AsStrMap()
	if err != nil {
		t.Fatalf("HGETALL: %v", err)
	}
	pttl, err := e.c.Do(ctx, e.c.B().Pttl().Key(e.hash).Build()).AsInt64()
	if err != nil {
		t.Fatalf("PTTL: %v", err)
	}
	checkDLQFields(t, e.c, e.key, m)
	return m, pttl
}

// checkDLQFields checks, and takes out of m, the hash's DLQField entries:
// each names an entry of key's message and its invocation in the stream's
// dead-letter stream, whose invocation field is marked written.
func checkDLQFields(t *testing.T, c rueidis.Client, key invocation.Key, m map[string]string) {
	t.Helper()
	for f, id := range m {
		inv, ok := strings.CutPrefix(f, dlqPrefix)
		if !ok {
			continue
		}
		delete(m, f)
		rows, err := c.Do(t.Context(), c.B().Xrange().Key(keys.DLQ(key.Stream)).Start(id).End(id).Build()).AsXRange()
		if err != nil || len(rows) != 1 {
			t.Errorf("%s = %s: no such dead-letter entry (%v)", f, id, err)
			continue
		}
		e, err := dlq.Decode(id, rows[0].FieldValues)
		if err != nil || e.OriginalID != key.MessageID || invocation.Field(e.App, e.Handler) != inv || !strings.HasSuffix(m[inv], ":dlq") {
			t.Errorf("%s = %s: entry %+v (%v) is not of %s of message %s marked written (%q)", f, id, e, err, inv, key.MessageID, m[inv])
		}
	}
}

// lease returns a lease on testField of e.key.
func (e *env) lease(attempt int, token string) invocation.Lease {
	return invocation.Lease{Key: e.key, Field: testField, Attempt: attempt, Token: token}
}

// checkPTTL asserts the TTL: -1 (none) and -2 (no key) exactly; a positive
// want means a TTL of at most want that has run less than 10s.
func checkPTTL(t *testing.T, want time.Duration, got int64) {
	t.Helper()
	switch {
	case want < 0:
		if got != int64(want) {
			t.Errorf("PTTL = %d, want %d", got, int64(want))
		}
	case got <= 0 || got > want.Milliseconds() || got < (want-10*time.Second).Milliseconds():
		t.Errorf("PTTL = %dms, want in (%v-10s, %v]", got, want, want)
	}
}

// claimOne runs one claim on s, as a batch of one.
func claimOne(ctx context.Context, s *Store, r invocation.ClaimRequest) (invocation.Claim, error) {
	res := s.Claim(ctx, []invocation.ClaimRequest{r})
	return res[0].Claim, res[0].Err
}

// settleOne applies one settlement on s, as a batch of one.
func settleOne(ctx context.Context, s *Store, st invocation.Settlement) invocation.SettleResult {
	return s.Settle(ctx, []invocation.Settlement{st})[0]
}

// req is a claim of testField of e.key.
func (e *env) req(lease time.Duration, maxAttempts int) invocation.ClaimRequest {
	return invocation.ClaimRequest{Key: e.key, Field: testField, Lease: lease, MaxAttempts: maxAttempts}
}

// one is the settlement of l's message with one transition of kind on l,
// with the dead-letter entry entryOf(l) when kind writes one and no Ack.
func one(kind invocation.TransitionKind, l invocation.Lease) invocation.Settlement {
	tr := invocation.Transition{Kind: kind, Lease: l}
	if kind == invocation.Exhaust || kind == invocation.DeadLetter {
		tr.Entry = entryOf(l)
	}
	return invocation.Settlement{Key: l.Key, Transitions: []invocation.Transition{tr}}
}

// acked is st with Ack at retention.
func acked(st invocation.Settlement, retention time.Duration) invocation.Settlement {
	st.Ack, st.Retention = true, retention
	return st
}

// apply is settleOne's error.
func apply(ctx context.Context, s *Store, st invocation.Settlement) error {
	return settleOne(ctx, s, st).Err
}

// entryTime is the Timestamp of every test's dead-letter entries.
var entryTime = time.UnixMilli(1700000000123).UTC()

// entryOf is a dead-letter entry of the invocation of l, as the Engine
// builds one, without OriginalStream, which Settle fills in.
func entryOf(l invocation.Lease) *dlq.Entry {
	app, handler, _ := strings.Cut(l.Field, "/")
	return &dlq.Entry{
		OriginalID: l.Key.MessageID, Group: l.Key.Group, Consumer: "c1", Event: "{}",
		Reason: "handler failed", App: app, Handler: handler, Deliveries: 3,
		HandlerAttempts: l.Attempt, Timestamp: entryTime, Trace: l.Trace,
	}
}

// stored is the entry of l as Settle stores it: entryOf(l) with the
// stream of its message.
func stored(l invocation.Lease) dlq.Entry {
	e := *entryOf(l)
	e.OriginalStream = l.Key.Stream
	return e
}

// dlqEntries returns the entries of stream's dead-letter stream, decoded
// with dlq.Decode (a test fails on one that does not decode).
func dlqEntries(t *testing.T, c rueidis.Client, stream string) []dlq.Entry {
	t.Helper()
	rows, err := c.Do(t.Context(), c.B().Xrange().Key(keys.DLQ(stream)).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", keys.DLQ(stream), err)
	}
	var out []dlq.Entry
	for _, r := range rows {
		e, err := dlq.Decode(r.ID, r.FieldValues)
		if err != nil {
			t.Fatalf("dead-letter entry %s %v: %v", r.ID, r.FieldValues, err)
		}
		out = append(out, e)
	}
	return out
}

// withoutIDs returns the ids of es and es with their IDs cleared.
func withoutIDs(es []dlq.Entry) (ids []string, out []dlq.Entry) {
	for _, e := range es {
		ids = append(ids, e.ID)
		e.ID = ""
		out = append(out, e)
	}
	return ids, out
}
