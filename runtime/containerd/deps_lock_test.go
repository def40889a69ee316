package containerd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/relaydev/relay/runtime/containerd"
)

// TestDepsLockOfAGoneWorker: the lease that makes Runners sharing a
// containerd build each dependency key once is not left to block the
// app's build until it expires (the build timeout) when the worker that
// took it died mid-build. A worker restarted under the same host id takes
// it over at once; one replaced under another host id, once the dead
// worker's presence is older than the orphan timeout. A live holder's
// lease is never taken, and a lease of an older Relay, without a host, only
// once it expired (docs/runtimes.md "Dependencies").
func TestDepsLockOfAGoneWorker(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const orphan = 2 * time.Second
	suffix := randomHex(4)
	lock := func(r *containerd.Runner, key string, within time.Duration) (func(), error) {
		ctx, cancel := context.WithTimeout(t.Context(), within)
		defer cancel()
		return containerd.LockDeps(ctx, r, key)
	}

	// A live holder keeps its lock, whatever the other's host id.
	holder := f.newRunner(t, "holder-"+suffix, containerd.WithOrphanTimeout(orphan))
	unlock, err := lock(holder, "live-"+suffix, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other := f.newRunner(t, "other-"+suffix, containerd.WithOrphanTimeout(orphan))
	if _, err := lock(other, "live-"+suffix, 2*orphan); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("another worker's lock of a live holder's key: %v, want to wait until its context ends", err)
	}
	unlock()
	if unlock, err = lock(other, "live-"+suffix, 10*time.Second); err != nil {
		t.Fatalf("lock after the holder released it: %v", err)
	}
	unlock()

	// A worker SIGKILLed mid-build and restarted under its host id.
	crashed := f.newRunner(t, "restarted-"+suffix)
	if _, err := lock(crashed, "restart-"+suffix, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	containerd.StopPresence(crashed) // as a SIGKILL stops it; the lease stays
	restarted := f.newRunner(t, "restarted-"+suffix)
	unlock, err = lock(restarted, "restart-"+suffix, 15*time.Second)
	if err != nil {
		t.Fatalf("the restarted worker's lock of its predecessor's key: %v, want it taken over", err)
	}
	unlock()

	// A worker SIGKILLed mid-build and replaced under another host id.
	gone := f.newRunner(t, "gone-"+suffix, containerd.WithOrphanTimeout(orphan))
	if _, err := lock(gone, "gone-"+suffix, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	containerd.StopPresence(gone)
	replacement := f.newRunner(t, "replacement-"+suffix, containerd.WithOrphanTimeout(orphan))
	unlock, err = lock(replacement, "gone-"+suffix, 5*orphan)
	if err != nil {
		t.Fatalf("the replacement's lock of a gone host's key: %v, want it taken over after the orphan timeout", err)
	}
	unlock()

	// A lease without a host (an older Relay) waits for its expiry.
	ctx := namespaces.WithNamespace(t.Context(), f.client.DefaultNamespace())
	ls := f.client.LeasesService()
	old, err := ls.Create(ctx, leases.WithID("relay-deps-old-"+suffix), leases.WithExpiration(time.Hour),
		leases.WithLabel(containerd.LabelOwner, "1-1-old"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ls.Delete(context.WithoutCancel(ctx), old) })
	if _, err := lock(replacement, "old-"+suffix, 2*orphan); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lock of an older Relay's unexpired lease: %v, want to wait", err)
	}
}
