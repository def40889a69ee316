package benchkit

import (
	"context"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// ackTracer is the Redis client of a worker whose spec sets TraceAcks: it
// records when each command that can acknowledge a message (XACK, or a
// script: Relay acknowledges inside its settle script) returned, for every
// stream entry id the command names, in a key (an invocation hash) or an
// argument. The trickle latency of bench/pipeline asks for that time
// (Worker.AckAt), so the publish → ack latency needs no polling of the
// worker's side and no hook into the Engine, whatever its version.
//
// Only the last such return per id is kept: the settlement that
// acknowledged the message is the last command naming it, as nothing is
// sent about a message once it has left the PEL.
type ackTracer struct {
	rueidis.Client
	mu   sync.Mutex
	last map[string]time.Time
}

func newAckTracer(c rueidis.Client) *ackTracer {
	return &ackTracer{Client: c, last: map[string]time.Time{}}
}

func (t *ackTracer) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	// The ids are read before Do: rueidis may recycle cmd once it is sent.
	ids := ackedIDs(cmd.Commands())
	res := t.Client.Do(ctx, cmd)
	t.note(ids, res.Error())
	return res
}

func (t *ackTracer) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	ids := make([][]string, len(cmds))
	for i, c := range cmds {
		ids[i] = ackedIDs(c.Commands())
	}
	res := t.Client.DoMulti(ctx, cmds...)
	for i, r := range res {
		t.note(ids[i], r.Error())
	}
	return res
}

func (t *ackTracer) note(ids []string, err error) {
	if len(ids) == 0 || (err != nil && !rueidis.IsRedisNil(err)) {
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		t.last[id] = now
	}
}

// ackAt returns when the last command naming id returned, and forgets it.
// It waits up to wait for one: whoever saw the message acknowledged in
// Redis may ask before the acknowledging command's reply has reached this
// process.
func (t *ackTracer) ackAt(id string, wait time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(wait)
	for {
		t.mu.Lock()
		at, ok := t.last[id]
		delete(t.last, id)
		t.mu.Unlock()
		if ok || time.Now().After(deadline) {
			return at, ok
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// ackedIDs returns the stream entry ids (<ms>-<seq>) an XACK, EVALSHA or
// EVAL names, anywhere in its arguments; nil for any other command.
func ackedIDs(args []string) []string {
	if len(args) == 0 {
		return nil
	}
	switch args[0] {
	case "XACK", "EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO", "FCALL":
	default:
		return nil
	}
	var ids []string
	for _, a := range args[1:] {
		ids = appendIDs(ids, a)
	}
	return ids
}

// appendIDs appends to ids every maximal run of digits, '-', digits in s
// that no other digit or '-' touches.
func appendIDs(ids []string, s string) []string {
	digit := func(i int) bool { return i >= 0 && i < len(s) && s[i] >= '0' && s[i] <= '9' }
	for i := 0; i < len(s); {
		if !digit(i) || (i > 0 && (digit(i-1) || s[i-1] == '-')) {
			i++
			continue
		}
		j := i
		for digit(j) {
			j++
		}
		if j >= len(s) || s[j] != '-' || !digit(j+1) {
			i = j
			continue
		}
		k := j + 1
		for digit(k) {
			k++
		}
		if k == len(s) || s[k] != '-' {
			ids = append(ids, s[i:k])
		}
		i = k
	}
	return ids
}
