package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/bench/internal/benchkit"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
)

// TestMain serves as a worker when measure starts this test binary as one.
func TestMain(m *testing.M) {
	if benchkit.IsWorker() {
		benchkit.WorkerMain()
	}
	redistest.Main(m)
}

// TestMeasureDrainsEveryEvent runs every mode on a small stream: measure
// returns only once the group has delivered and acknowledged every event,
// and fails unless the workers handled exactly that many; the engine modes
// leave each message's invocation succeeded and retained, and the command
// counts show what each mode sent (the reclaim mode takes the events over
// with XAUTOCLAIM).
func TestMeasureDrainsEveryEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	admin := redistest.Client(t)
	dir := t.TempDir()
	apps, err := benchkit.WriteApps(dir, benchkit.AppSpec{Concurrency: 10000})
	if err != nil {
		t.Fatal(err)
	}
	// cfg.reads stays zero: the test server may have other clients, so
	// the reads counted include the polls' (and maybe theirs).
	cfg := config{redis: redistest.Addr(t), events: 300, concurrency: 4, batch: 8, runs: 1, logLevel: "info", dir: dir, apps: apps}
	for _, tc := range []struct {
		mode      string
		retention time.Duration
		workers   int
		want      []string // commands every event costs, at least once
	}{
		{benchkit.KindRaw, 0, 2, []string{"xreadgroup", "xack"}},
		{benchkit.KindEngine, 0, 2, []string{"evalsha", "xack", "xreadgroup"}},
		{benchkit.KindEngine, relay.DeleteOnAck, 2, []string{"evalsha", "xack", "xreadgroup"}},
		{modeReclaim, 0, 2, []string{"evalsha", "xack", "xautoclaim"}},
	} {
		name := redistest.Name(t, tc.mode)
		r, err := measure(t.Context(), cfg, admin, tc.mode, tc.retention, name, tc.workers)
		if err != nil {
			t.Fatalf("%s: %v", tc.mode, err)
		}
		// The stream's 300 entries of about 1 KB stay.
		if r.events != cfg.events || r.elapsed <= 0 || r.rate() <= 0 || r.bytes < 100*int64(cfg.events) {
			t.Errorf("%s: result %+v", tc.mode, r)
		}
		// The workers' cost up to the drain, and the reads of their round
		// trips: at least one per batch read, however the loop polled.
		if r.workerCPU <= 0 || r.mallocs == 0 || r.server.Reads < int64(cfg.events/cfg.batch) {
			t.Errorf("%s: worker CPU %s, %d allocations, %d Redis reads for %d events", tc.mode, r.workerCPU, r.mallocs, r.server.Reads, r.events)
		}
		for _, c := range tc.want {
			if r.server.Calls[c] == 0 {
				t.Errorf("%s: no %s counted (%s)", tc.mode, c, r.server.PerEvent(r.events))
			}
		}
		if tc.mode == benchkit.KindRaw && r.server.Calls["evalsha"] != 0 {
			t.Errorf("raw mode ran scripts: %s", r.server.PerEvent(r.events))
		}
		if tc.retention == relay.DeleteOnAck {
			// Deleted with the acknowledgement: no state is left.
			ks, err := admin.Do(t.Context(), admin.B().Keys().Pattern(keys.InvocationPattern(name, group)).Build()).AsStrSlice()
			if err != nil || len(ks) != 0 {
				t.Errorf("engine with retention 0: %d invocation hashes left (%v), want none", len(ks), err)
			}
		} else if tc.mode != benchkit.KindRaw {
			// Claims and settlements run in batched script calls (docs/delivery.md,
			// "Batched transitions"), so the count of EVALSHA says nothing per
			// event; every event's retained state does.
			entries, err := admin.Do(t.Context(), admin.B().Xrange().Key(name).Start("-").End("+").Build()).AsXRange()
			if err != nil || len(entries) != cfg.events {
				t.Fatalf("engine: XRANGE: %d entries, %v", len(entries), err)
			}
			cmds := make(rueidis.Commands, 0, len(entries))
			for _, e := range entries {
				cmds = append(cmds, admin.B().Hgetall().Key(keys.Invocation(name, group, e.ID)).Build())
			}
			for i, res := range admin.DoMulti(t.Context(), cmds...) {
				st, err := res.AsStrMap()
				if err != nil || st[benchkit.AppName+"/"+benchkit.HandlerName] != "ok" || st["__terminal"] != "1" {
					t.Errorf("engine: state of %s = %v, %v; want ok and retained", entries[i].ID, st, err)
				}
			}
			logs, _ := os.ReadFile(dir + "/" + name + "-w1.log")
			if !strings.Contains(string(logs), "invocation succeeded") {
				t.Errorf("engine: worker log lacks the info lines relay start writes:\n%.500s", logs)
			}
		}
		cleanup(t.Context(), admin, name)
		if n, err := admin.Do(t.Context(), admin.B().Exists().Key(name).Build()).AsInt64(); err != nil || n != 0 {
			t.Errorf("%s: stream left after cleanup: %d, %v", tc.mode, n, err)
		}
	}
}

// TestTrickleTracesEveryAcknowledgement runs the trickle latency briefly:
// it fails unless each worker traced the acknowledgement of every event,
// after its XADD.
func TestTrickleTracesEveryAcknowledgement(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	admin := redistest.Client(t)
	dir := t.TempDir()
	apps, err := benchkit.WriteApps(dir, benchkit.AppSpec{Concurrency: 10000})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config{redis: redistest.Addr(t), concurrency: 4, batch: 8, logLevel: "info", dir: dir, apps: apps,
		retentions: []retention{{text: "48h", d: 48 * time.Hour}}, trickle: 3, trickleInterval: 40 * time.Millisecond}
	if err := trickle(t.Context(), cfg, admin, redistest.Name(t, "trickle")); err != nil {
		t.Fatal(err)
	}
}
