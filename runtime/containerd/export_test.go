package containerd

import (
	"context"
	"strconv"
	"time"
)

// StopPresence stops r refreshing its presence label and leaves the label
// and every container in place, as a SIGKILL of its process would.
func StopPresence(r *Runner) { r.stopPresence() }

// OwnedByAnotherLiveRunner exposes ownedByAnotherLiveRunner.
func OwnedByAnotherLiveRunner(r *Runner, owner string) bool {
	return r.ownedByAnotherLiveRunner(context.Background(), owner)
}

// Owner returns r's relay.owner value.
func Owner(r *Runner) string { return r.presence.owner }

// OwnerOf returns the "<pid>-<start time>" prefix of a relay.owner value
// for process pid.
func OwnerOf(pid int) string {
	start, _, _ := procStat(pid)
	return strconv.Itoa(pid) + "-" + start
}

// PreparedReady returns how many prepared containers of app r holds ready
// to be taken.
func PreparedReady(r *Runner, app string) int {
	r.oneShot.mu.Lock()
	defer r.oneShot.mu.Unlock()
	if a := r.oneShot.apps[app]; a != nil {
		return len(a.ready)
	}
	return 0
}

// LockDeps exposes lockDeps: it takes the build lock of key and returns
// its release.
func LockDeps(ctx context.Context, r *Runner, key string) (func(), error) {
	_, unlock, err := r.lockDeps(ctx, key)
	return unlock, err
}

// CopyRetention is how long an unused copy of the exec helper or of a
// bootstrap stays.
const CopyRetention = copyRetention

// PrepareFailed exposes prepareFailed: it logs that preparing container id
// of app failed with err at now.
func PrepareFailed(r *Runner, app, id string, err error, now time.Time) {
	r.prepareFailed(context.Background(), app, id, err, now)
}
