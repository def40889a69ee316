package main

import (
	"fmt"
	"testing"

	"github.com/relaydev/relay/bench/internal/benchkit"
	"github.com/relaydev/relay/internal/redistest"
)

// TestMain serves as a worker when measure starts this test binary as one.
func TestMain(m *testing.M) {
	if benchkit.IsWorker() {
		benchkit.WorkerMain()
	}
	redistest.Main(m)
}

// TestScenariosHoldWhatTheyDescribe runs every scenario on a few messages
// and checks that the worker was measured in the state its row names: no
// handler when idle, MAX_CONCURRENCY handlers and no more entries owned
// than it can start (its message slots and one reclaimed entry waiting for
// one) for a backlog or orphaned entries, every message in a handler when
// in flight.
func TestScenariosHoldWhatTheyDescribe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	const n, concurrency = 12, 2
	admin := redistest.Client(t)
	apps, err := benchkit.WriteApps(t.TempDir(), benchkit.AppSpec{Concurrency: 10000, Timeout: "15m"})
	if err != nil {
		t.Fatal(err)
	}
	for i, sc := range scenarios(concurrency) {
		if sc.concurrency == 0 {
			sc.concurrency = n
		}
		name := redistest.Name(t, fmt.Sprint(i))
		rep, owned, err := measure(t.Context(), redistest.Addr(t), apps, admin, name, n, sc)
		cleanup(t.Context(), admin, name)
		if err != nil {
			t.Fatalf("%s: %v", sc.name, err)
		}
		if want := int64(sc.expectStarted(n, sc.concurrency)); rep.Started != want {
			t.Errorf("%s: %d handlers started, want %d", sc.name, rep.Started, want)
		}
		if sc.maxOwned != nil && owned > int64(sc.maxOwned(n, sc.concurrency)) {
			t.Errorf("%s: worker owns %d PEL entries, want at most %d", sc.name, owned, sc.maxOwned(n, sc.concurrency))
		}
		if rep.RSS <= 0 || rep.HeapInuse <= 0 || rep.Goroutines <= 0 {
			t.Errorf("%s: memory report %+v", sc.name, rep)
		}
	}
}
