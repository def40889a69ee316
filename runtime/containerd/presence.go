package containerd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// LabelPresencePrefix + host id is a label of the containerd namespace whose
// value is "<Unix milliseconds> <owner>": when the Runner with that host id
// last said it was alive, and its LabelOwner value, so that a Runner
// notices another process writing the same label (two workers given one
// host id). Sweep removes the containers of a host whose
// presence is older than the orphan timeout (WithOrphanTimeout), so that a
// worker replaced under another host id (a Kubernetes pod of a new name, a
// killed CLI) does not leave warm containers or hung handlers running
// forever. The Runners sharing a namespace share a machine, hence a clock.
const LabelPresencePrefix = "relay.presence/"

// presence keeps this Runner's presence label fresh from its first Run or
// Sweep until Close.
type presence struct {
	once sync.Once
	stop chan struct{} // closed by Close
	done chan struct{} // closed when the refresh loop returned

	owner string // this Runner's LabelOwner value, also in the label's value

	mu      sync.Mutex
	closed  bool
	healthy time.Time // since when refreshes have been succeeding; zero after a failure
	written string    // the value this Runner wrote last
}

// presenceRetry is the pause after a failed refresh: short, so that after a
// containerd outage the label is fresh again before other Runners judge it.
const presenceRetry = 5 * time.Second

// announce writes the presence label once and starts its refresh loop; a
// Run calls it before creating anything, so a host with containers has a
// label. It does nothing after Close.
func (r *Runner) announce(ctx context.Context) {
	p := &r.presence
	p.once.Do(func() {
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return
		}
		p.done = make(chan struct{})
		r.refreshPresence(ctx)
		go r.presenceLoop()
	})
}

func (r *Runner) presenceLoop() {
	p := &r.presence
	defer close(p.done)
	every := r.orphanTimeout / 5
	for {
		wait := every
		p.mu.Lock()
		if p.healthy.IsZero() {
			wait = min(every, presenceRetry)
		}
		p.mu.Unlock()
		select {
		case <-p.stop:
			return
		case <-time.After(wait):
			r.refreshPresence(context.Background())
		}
	}
}

func (r *Runner) refreshPresence(ctx context.Context) {
	ctx, cancel := r.detached(ctx)
	defer cancel()
	now := time.Now()
	key := LabelPresencePrefix + r.hostID
	value := strconv.FormatInt(now.UnixMilli(), 10) + " " + r.presence.owner
	labels, err := r.client.NamespaceService().Labels(ctx, r.namespace)
	if err == nil {
		r.noteTwin(ctx, labels[key])
		err = r.client.NamespaceService().SetLabel(ctx, r.namespace, key, value)
	}
	p := &r.presence
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		p.written = value
	}
	switch {
	case err != nil:
		if !p.healthy.IsZero() {
			r.logger.LogAttrs(ctx, slog.LevelWarn, "cannot refresh this worker's presence in containerd; other workers may take its containers for a crashed worker's",
				slog.String("namespace", r.namespace), slog.Any("error", err))
		}
		p.healthy = time.Time{}
	case p.healthy.IsZero():
		p.healthy = now
	}
}

// noteTwin warns when the label holds another value than the one this
// Runner wrote last: another process with the same host id refreshed it.
// Sweep itself tells their containers apart by relay.owner.
func (r *Runner) noteTwin(ctx context.Context, current string) {
	p := &r.presence
	p.mu.Lock()
	twin := current != "" && p.written != "" && current != p.written
	p.mu.Unlock()
	if twin {
		r.logger.LogAttrs(ctx, slog.LevelWarn, "another process uses this worker's host id: each worker sharing a containerd needs its own (relay start: RELAY_CONSUMER)",
			slog.String("host_id", r.hostID))
	}
}

// liveRunners holds the owner ids (LabelOwner) of this process's Runners
// from New until Close.
var liveRunners sync.Map

// ownedByAnotherLiveRunner reports whether owner, a relay.owner value
// ("<pid>-<start time>-<random>"), is another Runner that may still run:
// one of this process, or a live process with its pid and start time. A
// pid equal to this process's that is not one of its Runners was a
// previous process's: a worker restarted in a container gets pid 1 again.
// An empty or foreign owner is nobody's.
func (r *Runner) ownedByAnotherLiveRunner(ctx context.Context, owner string) bool {
	if owner == "" || owner == r.presence.owner {
		return false
	}
	if _, ok := liveRunners.Load(owner); ok {
		return true
	}
	parts := strings.Split(owner, "-")
	pid, err := strconv.Atoi(parts[0])
	if len(parts) < 2 || err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	start := ""
	if len(parts) == 3 {
		start = parts[1]
	}
	if processLives(pid, start) {
		r.logger.LogAttrs(ctx, slog.LevelDebug, "sparing a container of another live process with this host id",
			slog.String("owner", owner))
		return true
	}
	return false
}

// ownerPrefix returns this process's relay.owner prefix, "<pid>-<start time>",
// the start time empty where /proc cannot tell it.
func ownerPrefix() string {
	start, _, _ := procStat(os.Getpid())
	return strconv.Itoa(os.Getpid()) + "-" + start
}

// processLives reports whether process pid runs and, when start is set,
// is the one that started then (not a later process given the same pid).
// A zombie, killed but not yet reaped by its parent, is gone.
func processLives(pid int, start string) bool {
	st, state, err := procStat(pid)
	switch {
	case err == nil:
		return state != 'Z' && state != 'X' && (start == "" || st == start)
	case errors.Is(err, fs.ErrNotExist):
		return false
	}
	// No /proc to read: whether the pid exists is all one can know.
	err = syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// procStat returns the start time (clock ticks after boot) and the state
// of process pid from /proc/<pid>/stat (proc(5)).
func procStat(pid int) (start string, state byte, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, err
	}
	// The command name, field 2, is in parentheses and may hold anything.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return "", 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 20 || len(f[0]) == 0 {
		return "", 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return f[19], f[0][0], nil
}

// parsePresence reads a presence label value, "<Unix milliseconds>
// <owner>": the time and the owner (LabelOwner) it names.
func parsePresence(v string) (at time.Time, owner string, ok bool) {
	ms, owner, _ := strings.Cut(v, " ")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}, "", false
	}
	return time.UnixMilli(n), owner, true
}

// healthyFor reports whether this Runner's own refreshes have succeeded for
// at least d: only then has every live Runner had the time to refresh its
// label after a containerd outage, and a stale label means a gone host.
func (r *Runner) healthyFor(d time.Duration) bool {
	p := &r.presence
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.healthy.IsZero() && time.Since(p.healthy) >= d
}

// withdraw stops the refresh loop and removes the label (Close).
func (r *Runner) withdraw(ctx context.Context) error {
	if !r.stopPresence() {
		return nil
	}
	ctx, cancel := r.detached(namespaces.WithNamespace(ctx, r.namespace))
	defer cancel()
	key := LabelPresencePrefix + r.hostID
	labels, err := r.client.NamespaceService().Labels(ctx, r.namespace)
	if err != nil {
		return err
	}
	r.presence.mu.Lock()
	mine := labels[key] == r.presence.written
	r.presence.mu.Unlock()
	if !mine {
		return nil // a live twin's now: it keeps its containers covered
	}
	return r.client.NamespaceService().SetLabel(ctx, r.namespace, key, "")
}

// stopPresence stops the refresh loop for good and reports whether the
// label was ever written. It is idempotent.
func (r *Runner) stopPresence() (announced bool) {
	p := &r.presence
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	p.closed = true
	close(p.stop)
	p.mu.Unlock()
	liveRunners.Delete(p.owner)
	p.once.Do(func() {}) // waits for an announce in progress; none from now on
	if p.done == nil {
		return false
	}
	<-p.done
	return true
}

// sweepGoneHosts removes the containers and snapshots of every other host
// whose presence label is older than the orphan timeout, then the label.
// Hosts without a label (a Relay from before presence labels, another
// tool) are left alone.
func (r *Runner) sweepGoneHosts(ctx context.Context) error {
	if !r.healthyFor(r.orphanTimeout / 2) {
		return nil
	}
	labels, err := r.client.NamespaceService().Labels(ctx, r.namespace)
	if err != nil {
		return err
	}
	var errs []error
	for k, v := range labels {
		host, ok := strings.CutPrefix(k, LabelPresencePrefix)
		if !ok || host == r.hostID {
			continue
		}
		at, _, ok := parsePresence(v)
		if !ok {
			continue // not ours to interpret
		}
		age := time.Since(at)
		if age < r.orphanTimeout {
			continue
		}
		r.logger.LogAttrs(ctx, slog.LevelWarn, "removing the containers of a worker gone without cleaning up",
			slog.String("host_id", host), slog.Duration("last_seen_ago", age.Truncate(time.Second)))
		if err := r.sweepHost(ctx, host); err != nil {
			errs = append(errs, err)
			continue
		}
		// A host that comes back writes its label again at its next refresh.
		if err := r.client.NamespaceService().SetLabel(ctx, r.namespace, k, ""); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
