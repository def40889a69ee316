package faults_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// The ledger a soak's workers keep in Redis, next to the engine's own state,
// so that the test can check what happened across kills and restarts. Every
// key starts with the soak's stream name; ledgerKey builds them. An
// invocation is named "<message id>/<app>/<handler>" throughout.
const (
	// keySeq is one INCR counter: the shared monotonic clock of the ledger.
	keySeq = "seq"
	// keyRunIDs makes recording idempotent: a retried record whose first
	// try was applied (the reply was lost) is not counted twice.
	keyRunIDs = "run_ids"
	// keyRuns counts handler runs per invocation (the handler itself
	// started: the Func body ran, or the container printed its marker).
	keyRuns = "runs"
	// keyLastRun holds the sequence number of each invocation's latest run.
	keyLastRun = "last_run"
	// keyAttemptRuns counts runs per "<invocation>/<attempt>": more than
	// one is an attempt re-run without being charged.
	keyAttemptRuns = "attempt_runs"
	// keyLateRuns lists runs that started when the invocation was already
	// terminal (ok or exhausted): "<seq> <attempt> <state>".
	keyLateRuns = "late_runs"
	// keyCalls, keyLastCall, keyCallAttempts and keyLateCalls are the same
	// for Runner.Run calls, which precede container creation.
	keyCalls        = "calls"
	keyLastCall     = "last_call"
	keyCallAttempts = "call_attempts"
	keyLateCalls    = "late_calls"
	// keyDelayedRuns and keyDelayedCalls list records that reached Redis
	// more than recordDelay after their run or call started (a Redis
	// restart held the write): the state they read is not the state at
	// the start, so they are neither late runs nor last runs, only
	// counted: "<seq> <attempt> <state> <delay ms>".
	keyDelayedRuns  = "delayed_runs"
	keyDelayedCalls = "delayed_calls"
	// keyOKSeq holds, per invocation, a sequence number taken right after
	// StateStore.Finish returned success: every run of that invocation must
	// have a smaller one.
	keyOKSeq = "ok_seq"
	// keyEnds records "<invocation>/<attempt>" of big-output handlers whose
	// end marker came through the output forwarding.
	keyEnds = "ends"
	// keyEarlyAcks lists messages acknowledged while an invocation was not
	// terminal: id -> the invocation hash at that moment.
	keyEarlyAcks = "early_acks"
	// keyMissing is the set of ids Reclaim reported as deleted, as the
	// engine was told of them.
	keyMissing = "missing"
	// keyMissingMetric holds each worker process's
	// relay_missing_payload_total, "<consumer>/<pid>" -> value.
	keyMissingMetric = "missing_metric"
	// keyAckStates and keyDLQEntries stand in for the invocation hashes
	// and the dead-letter stream when retention removes them before the
	// check (TestSoakRetention): the state a message was acknowledged
	// with, id -> JSON object, and every dead-letter entry written,
	// entry id -> JSON dlq.Entry.
	keyAckStates  = "ack_states"
	keyDLQEntries = "dlq_entries"
)

func ledgerKey(streamName, name string) string { return streamName + ":ledger:" + name }

// recordDelay is how long after its run started a record may reach Redis
// and still be taken for the state at the start. A record held longer (a
// Redis restart mid-write) may find the invocation terminal because its
// lease expired meanwhile and another delivery charged it: at least once,
// not a run after terminal.
const recordDelay = 250 * time.Millisecond

// recordRunScript records one run (or one Runner call) of an invocation and
// the invocation's state at that moment, atomically: what the script reads
// is exactly the state when the run started, in Redis's own order, unless
// the record reached Redis more than ARGV[6] ms after ARGV[5] (the system
// clock, the same as Redis's on this machine).
//
// KEYS[1] invocation hash   KEYS[2] seq        KEYS[3] run ids
// KEYS[4] runs (count)      KEYS[5] last run   KEYS[6] attempt runs
// KEYS[7] late runs         KEYS[8] delayed records
// ARGV[1] invocation field "<app>/<handler>"
// ARGV[2] ledger name "<message id>/<app>/<handler>"
// ARGV[3] attempt
// ARGV[4] run id (random, one per run)
// ARGV[5] when the run started, Unix ms
// ARGV[6] recordDelay, ms
//
// Returns the run's sequence number, or 0 when run id was recorded before.
var recordRunScript = rueidis.NewLuaScript(`
if redis.call('HSETNX', KEYS[3], ARGV[4], 1) == 0 then
  return 0
end
local t = redis.call('TIME')
local delay = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[5])
local state = redis.call('HGET', KEYS[1], ARGV[1]) or ''
local seq = redis.call('INCR', KEYS[2])
redis.call('HINCRBY', KEYS[4], ARGV[2], 1)
redis.call('HINCRBY', KEYS[6], ARGV[2] .. '/' .. ARGV[3], 1)
if delay > tonumber(ARGV[6]) then
  redis.call('HSET', KEYS[8], ARGV[2] .. '/' .. ARGV[4], seq .. ' ' .. ARGV[3] .. ' ' .. state .. ' ' .. delay)
  return seq
end
redis.call('HSET', KEYS[5], ARGV[2], seq)
if state == 'ok' or string.sub(state, 1, 10) == 'exhausted:' then
  redis.call('HSET', KEYS[7], ARGV[2] .. '/' .. ARGV[4], seq .. ' ' .. ARGV[3] .. ' ' .. state)
end
return seq
`)

// recorder writes a worker's side of the ledger.
type recorder struct {
	rc                rueidis.Client
	stream, group     string
	consumer          string
	pid               int
	runKeys, callKeys [6]string
	// keepAcked records the state each acknowledgement was checked
	// against (keyAckStates).
	keepAcked bool
}

func newRecorder(rc rueidis.Client, streamName, group, consumer string, pid int) *recorder {
	k := func(n string) string { return ledgerKey(streamName, n) }
	return &recorder{
		rc: rc, stream: streamName, group: group, consumer: consumer, pid: pid,
		runKeys:  [6]string{k(keyRunIDs), k(keyRuns), k(keyLastRun), k(keyAttemptRuns), k(keyLateRuns), k(keyDelayedRuns)},
		callKeys: [6]string{k(keyRunIDs), k(keyCalls), k(keyLastCall), k(keyCallAttempts), k(keyLateCalls), k(keyDelayedCalls)},
	}
}

func invocationName(messageID, app, handler string) string {
	return messageID + "/" + app + "/" + handler
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// persistently retries op for a few seconds: the ledger, not the handler, is
// under test, so a Redis restart must not lose a record.
func persistently(ctx context.Context, op func(context.Context) error) error {
	var err error
	for range 100 {
		if err = op(ctx); err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

func (r *recorder) record(ctx context.Context, ks [6]string, messageID, app, handler string, attempt int) error {
	scriptKeys := []string{keys.Invocation(r.stream, r.group, messageID), ledgerKey(r.stream, keySeq), ks[0], ks[1], ks[2], ks[3], ks[4], ks[5]}
	// One run id and start for every try: a try applied whose reply was
	// lost is not counted again.
	args := []string{app + "/" + handler, invocationName(messageID, app, handler), fmt.Sprint(attempt), randomID(),
		fmt.Sprint(handedAt(ctx).UnixMilli()), fmt.Sprint(recordDelay.Milliseconds())}
	return persistently(ctx, func(ctx context.Context) error {
		return recordRunScript.Exec(ctx, r.rc, scriptKeys, args).Error()
	})
}

// handedKey is the context key of the moment the engine handed an
// attempt to the runtime (ledgerRunner.Run).
type handedKey struct{}

// handedAt returns when the attempt of ctx was handed to the runtime, or
// now outside a Run: a record's delay counts from there, so that a run the
// ledger's own call record held up (a Redis restart) is not judged by the
// state it finds when it finally starts.
func handedAt(ctx context.Context) time.Time {
	if t, ok := ctx.Value(handedKey{}).(time.Time); ok {
		return t
	}
	return time.Now()
}

// run records that the handler of one attempt started.
func (r *recorder) run(ctx context.Context, messageID, app, handler string, attempt int) error {
	return r.record(ctx, r.runKeys, messageID, app, handler, attempt)
}

// call records that the engine handed one attempt to the Runner.
func (r *recorder) call(ctx context.Context, req runtime.Request) error {
	return r.record(ctx, r.callKeys, req.MessageID, req.App, req.Handler, req.Attempt)
}

// finished takes a sequence number after Finish applied: an upper bound of
// the moment the success was recorded.
func (r *recorder) finished(ctx context.Context, l invocation.Lease) {
	name := l.Key.MessageID + "/" + l.Field
	_ = persistently(ctx, func(ctx context.Context) error {
		seq, err := r.rc.Do(ctx, r.rc.B().Incr().Key(ledgerKey(r.stream, keySeq)).Build()).AsInt64()
		if err != nil {
			return err
		}
		return r.rc.Do(ctx, r.rc.B().Hset().Key(ledgerKey(r.stream, keyOKSeq)).FieldValue().FieldValue(name, fmt.Sprint(seq)).Build()).Error()
	})
}

// terminalValue reports whether an invocation field's value is terminal:
// succeeded, or exhausted with its DLQ entry written.
func terminalValue(v string) bool {
	return v == "ok" || strings.HasPrefix(v, "exhausted:") && strings.HasSuffix(v, ":dlq")
}

// ackState reads the invocation hash of messageID before its ack and the
// invocations in it that are not terminal, those the ack's own settlement
// writes (writing, with the value they get) excepted.
func (r *recorder) ackState(ctx context.Context, messageID string, writing map[string]string) (map[string]string, []string, error) {
	st, err := r.rc.Do(ctx, r.rc.B().Hgetall().Key(keys.Invocation(r.stream, r.group, messageID)).Build()).AsStrMap()
	if err != nil {
		return nil, nil, err
	}
	var bad []string
	n := 0
	for f, v := range st {
		if strings.HasPrefix(f, "__") {
			continue
		}
		n++
		if _, ok := writing[f]; ok {
			continue
		}
		if !terminalValue(v) {
			bad = append(bad, f+"="+v)
		}
	}
	if n == 0 {
		bad = append(bad, "no invocation state")
	}
	return st, bad, nil
}

// keepAckState records, for keepAcked, the state the ack of messageID is
// made with, before the ack: a kill right after the ack must not lose it.
// The fields the ack's own settlement writes are kept as it writes them.
func (r *recorder) keepAckState(ctx context.Context, messageID string, st, writing map[string]string) error {
	if r.keepAcked {
		for f, v := range writing {
			st[f] = v
		}
		b, _ := json.Marshal(st)
		if err := r.rc.Do(ctx, r.rc.B().Hset().Key(ledgerKey(r.stream, keyAckStates)).FieldValue().
			FieldValue(messageID, string(b)).Build()).Error(); err != nil {
			return err
		}
	}
	return nil
}

// recordEarly records an ack of messageID made while the invocations bad
// lists were not terminal.
func (r *recorder) recordEarly(ctx context.Context, messageID string, bad []string) error {
	if len(bad) == 0 {
		return nil
	}
	return r.rc.Do(ctx, r.rc.B().Hset().Key(ledgerKey(r.stream, keyEarlyAcks)).FieldValue().
		FieldValue(messageID, strings.Join(bad, " ")).Build()).Error()
}

// missing records ids that Reclaim found deleted, before the engine learns
// of them.
func (r *recorder) missing(ctx context.Context, ids []string) {
	if len(ids) == 0 {
		return
	}
	_ = persistently(ctx, func(ctx context.Context) error {
		return r.rc.Do(ctx, r.rc.B().Sadd().Key(ledgerKey(r.stream, keyMissing)).Member(ids...).Build()).Error()
	})
}

// pushMissingMetric copies the engine's relay_missing_payload_total into
// Redis whenever it changes, until ctx is done, and once more then. The
// counter lives in the worker's memory; the soak pauses its kills until the
// copy has caught up, so no count dies with its process.
func (r *recorder) pushMissingMetric(ctx context.Context, reg *prometheus.Registry) {
	pushed := -1.0
	field := fmt.Sprintf("%s/%d", r.consumer, r.pid)
	push := func(ctx context.Context) {
		if v, ok := missingPayloadTotal(reg); ok && v != pushed {
			err := r.rc.Do(ctx, r.rc.B().Hset().Key(ledgerKey(r.stream, keyMissingMetric)).FieldValue().
				FieldValue(field, fmt.Sprint(v)).Build()).Error()
			if err == nil {
				pushed = v
			}
		}
	}
	for {
		push(ctx)
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			push(fctx)
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func missingPayloadTotal(reg *prometheus.Registry) (float64, bool) {
	ms, err := testutil.GatherMetrics(reg, "relay_missing_payload_total")
	if err != nil || len(ms) != 1 {
		return 0, false
	}
	return ms[0].GetCounter().GetValue(), true
}

// ledgerSource is the worker's stream source: it records what the engine is
// told by Reclaim.
// Embedding keeps Heartbeat and the optional capabilities (EnsureGroup,
// Pending); Reclaim, which reports deleted entries, is wrapped here, or the
// engine would learn of deletions the ledger misses.
type ledgerSource struct {
	*redisstream.Source
	rec *recorder
}

func (s ledgerSource) Reclaim(ctx context.Context, minIdle time.Duration, max int) ([]stream.Message, []string, bool, error) {
	msgs, deleted, done, err := s.Source.Reclaim(ctx, minIdle, max)
	s.rec.missing(ctx, deleted)
	return msgs, deleted, done, err
}

// ledgerState is the worker's state store, which settles its messages:
// every acknowledgement it makes is checked against the invocation state
// read just before (an early ack is one made while an invocation its
// settlement does not write is not terminal), a success it records takes a
// sequence number, and a dead-letter entry it writes is in the ledger
// (keyDLQEntries). The state is read and kept before the step, but an
// early ack is recorded only once the step applied: the fence may refuse
// it (a stale lease), and then nothing was acknowledged. It keeps the
// store's ClaimVoider.
type ledgerState struct {
	relay.StateStore
	rec *recorder
}

func (s ledgerState) Settle(ctx context.Context, ss []invocation.Settlement) []invocation.SettleResult {
	out := make([]invocation.SettleResult, len(ss))
	bad := make([][]string, len(ss))
	var pass []invocation.Settlement
	var at []int
	for i, st := range ss {
		if err := s.rec.intendDeadLetters(ctx, st); err != nil {
			out[i].Err = err
			continue
		}
		if st.Ack {
			writing := map[string]string{}
			for _, t := range st.Transitions {
				writing[t.Lease.Field] = "ok"
				if t.Kind == invocation.Exhaust || t.Kind == invocation.DeadLetter {
					writing[t.Lease.Field] = fmt.Sprintf("exhausted:%d:%s:dlq", t.Lease.Attempt, t.Lease.Token)
				}
			}
			state, b, err := s.rec.ackState(ctx, st.Key.MessageID, writing)
			if err == nil {
				err = s.rec.keepAckState(ctx, st.Key.MessageID, state, writing)
			}
			if err != nil {
				out[i].Err = fmt.Errorf("faults: check state before ack of %s: %w", st.Key.MessageID, err)
				continue
			}
			bad[i] = b
		}
		pass, at = append(pass, st), append(at, i)
	}
	if len(pass) == 0 {
		return out
	}
	for k, res := range s.StateStore.Settle(ctx, pass) {
		i := at[k]
		out[i] = res
		st := ss[i]
		_ = persistently(ctx, func(ctx context.Context) error { return s.rec.deadLettered(ctx, st, res) })
		if res.Err != nil {
			continue
		}
		for _, t := range st.Transitions {
			if t.Kind == invocation.Finish {
				s.rec.finished(ctx, t.Lease)
			}
		}
		if st.Ack {
			_ = persistently(ctx, func(ctx context.Context) error { return s.rec.recordEarly(ctx, st.Key.MessageID, bad[i]) })
		}
	}
	return out
}

// intendDeadLetters records, before st is applied, each dead-letter entry
// it writes (keyDLQEntries), under a field of its own until the entry's id
// is known (deadLettered): a kill after the settlement applied, which
// acknowledges the message, must not leave an entry the ledger misses.
// One that did not apply leaves a phantom entry, counted as a duplicate of
// the entry its redelivery then writes: at most one per fault.
func (r *recorder) intendDeadLetters(ctx context.Context, st invocation.Settlement) error {
	for _, t := range st.Transitions {
		if t.Entry == nil {
			continue
		}
		if err := r.recordEntry(ctx, intentField(t), "", *t.Entry); err != nil {
			return err
		}
	}
	return nil
}

// deadLettered records the ids of the dead-letter entries st wrote, with
// result res, in place of the intents intendDeadLetters recorded.
func (r *recorder) deadLettered(ctx context.Context, st invocation.Settlement, res invocation.SettleResult) error {
	for n, t := range st.Transitions {
		if t.Entry == nil {
			continue
		}
		if res.Err == nil && res.Transitions[n].DLQID != "" {
			if err := r.recordEntry(ctx, res.Transitions[n].DLQID, res.Transitions[n].DLQID, *t.Entry); err != nil {
				return err
			}
		}
		// Applied, written before, or refused: the intent is done with.
		if err := r.rc.Do(ctx, r.rc.B().Hdel().Key(ledgerKey(r.stream, keyDLQEntries)).Field(intentField(t)).Build()).Error(); err != nil {
			return err
		}
	}
	return nil
}

// intentField is the ledger field of the entry t is about to write.
func intentField(t invocation.Transition) string {
	return fmt.Sprintf("intent:%s:%s:%d:%s", t.Lease.Key.MessageID, t.Lease.Field, t.Lease.Attempt, t.Lease.Token)
}

// recordEntry records dead-letter entry e, with id, under field.
func (r *recorder) recordEntry(ctx context.Context, field, id string, e dlq.Entry) error {
	e.ID, e.OriginalStream = id, r.stream
	if e.ID == "" {
		e.ID = "0-0" // not written yet: sorted first
	}
	if e.Timestamp.IsZero() {
		e.Timestamp = time.Now()
	}
	b, _ := json.Marshal(e)
	if err := r.rc.Do(ctx, r.rc.B().Hset().Key(ledgerKey(r.stream, keyDLQEntries)).FieldValue().FieldValue(field, string(b)).Build()).Error(); err != nil {
		return fmt.Errorf("faults: record DLQ entry %s: %w", field, err)
	}
	return nil
}

// ledgerRunner records every attempt handed to the runtime, and keeps the
// inner Runner's Sweeper capability visible to the engine.
type ledgerRunner struct {
	relay.Runner
	rec *recorder
}

func (r ledgerRunner) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	ctx = context.WithValue(ctx, handedKey{}, time.Now())
	if err := r.rec.call(ctx, req); err != nil {
		// Not the handler's fault, and nothing ran: no attempt charged.
		return runtime.Result{}, fmt.Errorf("faults: record call: %w", err)
	}
	return r.Runner.Run(ctx, req)
}

func (r ledgerRunner) Sweep(ctx context.Context) error {
	if sw, ok := r.Runner.(relay.Sweeper); ok {
		return sw.Sweep(ctx)
	}
	return nil
}
