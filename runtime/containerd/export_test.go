package containerd

import (
	"context"

	"github.com/relaydev/relay/runtime/containerd/internal/presence"
	"github.com/relaydev/relay/runtime/containerd/internal/statedir"
)

// StopPresence stops r refreshing its presence label and leaves the label
// and every container in place, as a SIGKILL of its process would.
func StopPresence(r *Runner) { r.presence.Stop() }

// OwnedByAnotherLiveRunner exposes presence.OwnedByAnotherLiveRunner.
func OwnedByAnotherLiveRunner(r *Runner, owner string) bool {
	return r.presence.OwnedByAnotherLiveRunner(context.Background(), owner)
}

// Owner returns r's relay.owner value.
func Owner(r *Runner) string { return r.host.Owner }

// OwnerOf returns the "<pid>-<start time>" prefix of a relay.owner value
// for process pid.
func OwnerOf(pid int) string { return presence.OwnerPrefix(pid) }

// PreparedReady returns how many prepared containers of app r holds ready
// to be taken.
func PreparedReady(r *Runner, app string) int { return r.oneShot.Ready(app) }

// LockDeps exposes deps.Builder.Lock: it takes the build lock of key and
// returns its release.
func LockDeps(ctx context.Context, r *Runner, key string) (func(), error) {
	_, unlock, err := r.deps.Lock(ctx, key)
	return unlock, err
}

// CopyRetention is how long an unused copy of the exec helper or of a
// bootstrap stays.
const CopyRetention = statedir.Retention
