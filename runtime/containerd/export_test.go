package containerd

import (
	"context"
	"strconv"
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
