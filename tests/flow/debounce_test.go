package flow_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream"
)

const catalogTemplate = `
image: unused
concurrency: 8
events:
  - handler: probe.run
    pattern: {kind: [item]}
    timeout: 2s
    retries: 5
    debounce: {key: product, period: 500ms}
`

// The debounce period and the lease (timeout + LeaseGrace) of
// catalogTemplate's rule, in ms.
const (
	debouncePeriodMS = 500
	catalogLeaseMS   = 2000 + 1000
)

// burst is the events of one product published within less than the
// debounce period of each other.
type burst struct {
	product string
	ids     []string // in publish order, so in id order
	// claimedMS is when the newest event was recorded as the group's
	// latest (its first claim), on the Redis clock, from the debounce
	// record: its period's end minus the period.
	claimedMS int64
}

func (b *burst) newest() string { return b.ids[len(b.ids)-1] }

// Debounce loses nothing when workers are killed: bursts of events per
// product are published while worker processes are killed with SIGKILL at
// random and restarted. Of each burst the newest event runs, at least once
// (more only when a kill cut off a run of it); an older event runs only if
// its claim came before the newest was recorded (a crash delayed the
// newest's first claim), never after; every other one is acknowledged as
// superseded by a newer event of its product, its state superseded:<id>,
// with no attempt used. Nothing stays pending, nothing is dead-lettered
// (docs/flow-control.md#debounce).
func TestDebounceUnderKills(t *testing.T) {
	t.Parallel()
	tm := baseTimings()
	tm.LeaseGrace = time.Second
	tm.ProbeKey = "product"
	const field = "catalog/" + probeHandler
	c := newCluster(t, map[string]string{"catalog": catalogTemplate}, tm)
	names := []string{"w1", "w2", "w3"}
	c.startWorkers(names...)

	// Kill a worker at random every 0.3-1s and start it again, one at a
	// time, while the bursts go through.
	stopKills := testutil.Every(300*time.Millisecond, 700*time.Millisecond, func() {
		victim := names[rand.IntN(len(names))]
		c.kill(victim)
		c.start(victim)
		// Its engine runs before the next kill, which would be wasted
		// on a process still starting.
		for deadline := time.Now().Add(time.Minute); !c.started(victim) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
	})

	const products, burstsPer = 6, 6
	var mu sync.Mutex
	var bursts []*burst
	var wg sync.WaitGroup
	for p := range products {
		product := fmt.Sprintf("p%d", p)
		wg.Go(func() {
			for k := range burstsPer {
				b := &burst{product: product}
				for i := range 2 + rand.IntN(5) {
					if i > 0 {
						time.Sleep(20*time.Millisecond + rand.N(100*time.Millisecond))
					}
					b.ids = append(b.ids, c.publish(map[string]any{"kind": "item", "product": product, "burst": k, "n": i, "sleep_ms": 250 + rand.IntN(300)}))
				}
				mu.Lock()
				bursts = append(bursts, b)
				mu.Unlock()
				// The next burst of the product comes once this one's
				// newest has run: it would supersede it otherwise.
				if !c.waitState(b.newest(), field, "ok", 2*time.Minute) {
					t.Errorf("product %s burst %d: the newest event %s did not run within 2m (state %q)", product, k, b.newest(), c.state(b.newest(), field))
					return
				}
				rec, err := c.rc.Do(context.Background(), c.rc.B().Hgetall().Key(keys.Limit(c.stream, flowGroup, "debounce", field, product)).Build()).AsStrMap()
				if err != nil || rec["id"] != b.newest() {
					t.Errorf("product %s burst %d: debounce record %v (%v), want the newest event %s", product, k, rec, err, b.newest())
					return
				}
				var due int64
				if _, err := fmt.Sscan(rec["due"], &due); err != nil {
					t.Errorf("debounce record %v: %v", rec, err)
					return
				}
				b.claimedMS = due - debouncePeriodMS
				time.Sleep(rand.N(300 * time.Millisecond))
			}
		})
	}
	wg.Wait()
	stopKills()
	if t.Failed() {
		t.FailNow()
	}
	var last string
	for _, b := range bursts {
		if stream.CompareID(b.newest(), last) > 0 {
			last = b.newest()
		}
	}
	c.waitSettled(last, 2*time.Minute)
	c.checkCrashes()

	productOf := map[string]string{}
	for _, b := range bursts {
		for _, id := range b.ids {
			productOf[id] = b.product
		}
	}
	perID := byID(c.runs("catalog"))
	events, superseded, olderRan, reruns, cutOff := 0, 0, 0, 0, 0
	for _, rs := range perID {
		for _, r := range rs {
			if !r.ended() {
				cutOff++
			}
		}
	}
	for _, b := range bursts {
		events += len(b.ids)
		newest := b.newest()
		rs := perID[newest]
		if len(rs) == 0 {
			t.Errorf("product %s: the newest event %s of burst %v never ran", b.product, newest, b.ids)
		}
		// A run is repeated only when its worker was killed during it (or
		// before its outcome was recorded).
		for _, r := range rs[:max(0, len(rs)-1)] {
			if _, ok := c.killed(r.pid); !ok {
				t.Errorf("event %s ran again after attempt %d in pid %d, which was not killed", newest, r.attempt, r.pid)
			}
		}
		reruns += max(0, len(rs)-1)
		for _, id := range b.ids[:len(b.ids)-1] {
			v := c.state(id, "catalog/"+probeHandler)
			switch by, ok := strings.CutPrefix(v, "superseded:"); {
			case ok:
				superseded++
				if productOf[by] != b.product || stream.CompareID(by, id) <= 0 {
					t.Errorf("event %s of %s: %q, want superseded by a newer event of its product", id, b.product, v)
				}
			case v == "ok":
				olderRan++
			default:
				t.Errorf("older event %s of %s: state %q, want superseded:<newer id> (or ok, had it run before the newest was recorded)", id, b.product, v)
			}
			// It may have run only if claimed before its burst's newest
			// event was recorded as the latest.
			for _, r := range perID[id] {
				if claimed := r.deadline - catalogLeaseMS; r.deadline == 0 || claimed > b.claimedMS {
					t.Errorf("older event %s of %s ran (attempt %d, pid %d), claimed at %d, after the newest %s was recorded at %d",
						id, b.product, r.attempt, r.pid, claimed, newest, b.claimedMS)
				}
			}
		}
	}
	c.wantNoDLQ()
	if c.kills() < 5 {
		t.Errorf("only %d kills: the test needs more to mean anything", c.kills())
	}
	t.Logf("%d events in %d bursts of %d products: %d superseded, %d older ones ran (claimed before their newest), %d reruns of a newest event; %d kills, %d runs cut off by one",
		events, len(bursts), products, superseded, olderRan, reruns, c.kills(), cutOff)
}

// waitState waits until invocation field of message id has value want, at
// most timeout; it reports whether it did. Safe to call from any goroutine.
func (c *cluster) waitState(id, field, want string, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		v, err := c.rc.Do(context.Background(), c.rc.B().Hget().Key(keys.Invocation(c.stream, flowGroup, id)).Field(field).Build()).ToString()
		if err == nil && v == want {
			return true
		}
	}
	return false
}
