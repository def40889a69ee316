package flow_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/runtime"
)

// probe is the handler of every rule in the worker processes. Each run
// records, in one script on the Redis clock before it does anything else:
// its start, with its message id, attempt, worker pid, limit key and the
// end of the lease its claim took (read from the invocation hash); and it
// counts the runs of its key, and of its app, that run at once, keeping
// the highest count. At its end, before it returns, it records its end
// and counts itself out. A run killed with its worker has a start and no
// end, and stays counted in; tests that kill workers rebuild the overlap
// from the starts and ends (maxOverlap) instead.
type probe struct {
	rc            rueidis.Client
	stream, group string
	key           app.FieldPath
	pid           int
}

// probeNS is the prefix of the probe's keys of one app of stream.
func probeNS(stream, appName string) string { return "flowtest:" + stream + ":" + appName }

// probeStart: KEYS running of the key, max of the key, running of the app,
// max of the app, starts list, keys set, invocation hash; ARGV the record
// ("<id> <attempt> <pid> <key>"), the invocation field, the key.
var probeStart = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], n)
end
n = redis.call('INCR', KEYS[3])
if n > tonumber(redis.call('GET', KEYS[4]) or '0') then
  redis.call('SET', KEYS[4], n)
end
redis.call('SADD', KEYS[6], ARGV[3])
local v = redis.call('HGET', KEYS[7], ARGV[2]) or ''
local deadline = string.match(v, '^running:(%d+):') or '-'
redis.call('RPUSH', KEYS[5], string.format('%d', us) .. ' ' .. deadline .. ' ' .. ARGV[1])
return 1
`)

// probeEnd: KEYS running of the key, running of the app, ends list; ARGV
// the record.
var probeEnd = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('DECR', KEYS[1])
redis.call('DECR', KEYS[2])
redis.call('RPUSH', KEYS[3], string.format('%d', us) .. ' - ' .. ARGV[1])
return 1
`)

func (p *probe) run(ctx context.Context, req runtime.Request) error {
	var ev probeEvent
	if err := json.Unmarshal(req.Event, &ev); err != nil {
		return runtime.Permanent(err)
	}
	key := ""
	if p.key != "" {
		key = app.KeyOf(req.Event, p.key)
	}
	ns := probeNS(p.stream, req.App)
	rec := fmt.Sprintf("%s %d %d %s", req.MessageID, req.Attempt, p.pid, key)
	// The records are written whatever becomes of the run's context, so
	// that a run that timed out still says it ended.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := probeStart.Exec(wctx, p.rc,
		[]string{ns + ":running:" + key, ns + ":max:" + key, ns + ":running", ns + ":max", ns + ":starts", ns + ":keys",
			keys.Invocation(p.stream, p.group, req.MessageID)},
		[]string{rec, req.App + "/" + req.Handler, key}).Error()
	if err != nil {
		return err
	}
	if ev.Block > 0 && ev.Block == req.Attempt {
		<-ctx.Done()
	} else if ev.SleepMS > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(ev.SleepMS) * time.Millisecond):
		}
	}
	if err := probeEnd.Exec(wctx, p.rc, []string{ns + ":running:" + key, ns + ":running", ns + ":ends"}, []string{rec}).Error(); err != nil {
		return err
	}
	return ctx.Err()
}

// run is one run of a handler, as the probe recorded it. Times are the
// Redis server's.
type run struct {
	id           string
	attempt, pid int
	key          string
	// start and end are in Unix µs; end is 0 for a run that never
	// ended (its worker was killed).
	start, end int64
	// deadline is the end of the lease the run's claim took, Unix ms.
	deadline int64
}

// ended reports whether the run recorded its end.
func (r run) ended() bool { return r.end != 0 }

// startTime is the run's start.
func (r run) startTime() time.Time { return time.UnixMicro(r.start) }

// runs reads the runs of appName's handlers on stream, in start order.
func runs(t *testing.T, rc rueidis.Client, stream, appName string) []run {
	t.Helper()
	ctx := context.Background()
	ns := probeNS(stream, appName)
	starts, err := rc.Do(ctx, rc.B().Lrange().Key(ns+":starts").Start(0).Stop(-1).Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	ends, err := rc.Do(ctx, rc.B().Lrange().Key(ns+":ends").Start(0).Stop(-1).Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	endOf := map[string]int64{}
	for _, line := range ends {
		f := strings.SplitN(line, " ", 3)
		if len(f) != 3 {
			t.Fatalf("probe end record %q", line)
		}
		endOf[f[2]] = mustInt(t, f[0])
	}
	out := make([]run, 0, len(starts))
	for _, line := range starts {
		// "<us> <deadline|-> <id> <attempt> <pid> <key>"
		f := strings.SplitN(line, " ", 6)
		if len(f) != 6 {
			t.Fatalf("probe start record %q", line)
		}
		r := run{start: mustInt(t, f[0]), id: f[2], attempt: int(mustInt(t, f[3])), pid: int(mustInt(t, f[4])), key: f[5]}
		if f[1] != "-" {
			r.deadline = mustInt(t, f[1])
		}
		r.end = endOf[strings.Join(f[2:], " ")]
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b run) int { return cmp.Compare(a.start, b.start) })
	return out
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("probe record: %v", err)
	}
	return n
}

// peak is the highest count of appName's runs of key (all its runs when
// all) that the probe saw at once.
func peak(t *testing.T, rc rueidis.Client, stream, appName, key string, all bool) int {
	t.Helper()
	k := probeNS(stream, appName) + ":max:" + key
	if all {
		k = probeNS(stream, appName) + ":max"
	}
	n, err := rc.Do(context.Background(), rc.B().Get().Key(k).Build()).AsInt64()
	if err != nil && !rueidis.IsRedisNil(err) {
		t.Fatal(err)
	}
	return int(n)
}

// maxOverlap is the most runs of rs that overlap at one moment, a run that
// never ended lasting until endOf says.
func maxOverlap(rs []run, endOf func(run) int64) int {
	type edge struct {
		at   int64
		step int
	}
	var edges []edge
	for _, r := range rs {
		end := r.end
		if !r.ended() {
			end = endOf(r)
		}
		edges = append(edges, edge{r.start, 1}, edge{end, -1})
	}
	// An end and a start at the same µs do not overlap.
	slices.SortFunc(edges, func(a, b edge) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.step, b.step)) })
	n, most := 0, 0
	for _, e := range edges {
		n += e.step
		most = max(most, n)
	}
	return most
}

// byID groups runs by message id.
func byID(rs []run) map[string][]run {
	m := map[string][]run{}
	for _, r := range rs {
		m[r.id] = append(m[r.id], r)
	}
	return m
}
