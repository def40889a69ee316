// Package presence keeps a Runner's presence label on its containerd
// namespace fresh and judges the labels and owners of others: whether the
// process that created a container, or holds a lease, still lives.
package presence

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

	"github.com/relaydev/relay/runtime/containerd/internal/core"
)

// LabelPrefix + host id is a label of the containerd namespace whose
// value is "<Unix milliseconds> <owner>": when the Runner with that host id
// last said it was alive, and its LabelOwner value, so that a Runner
// notices another process writing the same label (two workers given one
// host id). Sweep removes the containers of a host whose
// presence is older than the orphan timeout (WithOrphanTimeout), so that a
// worker replaced under another host id (a Kubernetes pod of a new name, a
// killed CLI) does not leave warm containers or hung handlers running
// forever. The Runners sharing a namespace share a machine, hence a clock.
const LabelPrefix = "relay.presence/"

// Presence keeps one Runner's presence label fresh from its first Run or
// Sweep until Stop, and tells the Runner who else lives. It is safe for
// concurrent use.
type Presence struct {
	host          *core.Host
	orphanTimeout time.Duration

	once sync.Once
	stop chan struct{} // closed by Stop
	done chan struct{} // closed when the refresh loop returned

	mu      sync.Mutex
	closed  bool
	healthy time.Time // since when refreshes have been succeeding; zero after a failure
	written string    // the value this Runner wrote last
}

// New returns the Presence of host's Runner, whose label goes stale after
// orphanTimeout (WithOrphanTimeout), and counts host.Owner among the live
// Runners of this process until Stop. It writes nothing yet (Announce).
func New(host *core.Host, orphanTimeout time.Duration) *Presence {
	liveRunners.Store(host.Owner, struct{}{})
	return &Presence{host: host, orphanTimeout: orphanTimeout, stop: make(chan struct{})}
}

// NewOwner returns a new LabelOwner value for a Runner of this process,
// "<pid>-<start time>-<random>".
func NewOwner() string { return OwnerPrefix(os.Getpid()) + "-" + core.RandomHex(6) }

// OrphanTimeout is how long a presence label may go unrefreshed before
// its host is taken for gone.
func (p *Presence) OrphanTimeout() time.Duration { return p.orphanTimeout }

// presenceRetry is the pause after a failed refresh: short, so that after a
// containerd outage the label is fresh again before other Runners judge it.
const presenceRetry = 5 * time.Second

// Announce writes the presence label once and starts its refresh loop; a
// Run calls it before creating anything, so a host with containers has a
// label. It does nothing after Stop.
func (p *Presence) Announce(ctx context.Context) {
	p.once.Do(func() {
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return
		}
		p.done = make(chan struct{})
		p.refresh(ctx)
		go p.loop()
	})
}

func (p *Presence) loop() {
	defer close(p.done)
	every := p.orphanTimeout / 5
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
			p.refresh(context.Background())
		}
	}
}

func (p *Presence) refresh(ctx context.Context) {
	h := p.host
	ctx, cancel := h.Detached(ctx)
	defer cancel()
	now := time.Now()
	key := LabelPrefix + h.HostID
	value := strconv.FormatInt(now.UnixMilli(), 10) + " " + h.Owner
	labels, err := h.Client.NamespaceService().Labels(ctx, h.Namespace)
	if err == nil {
		p.noteTwin(ctx, labels[key])
		err = h.Client.NamespaceService().SetLabel(ctx, h.Namespace, key, value)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		p.written = value
	}
	switch {
	case err != nil:
		if !p.healthy.IsZero() {
			h.Logger.LogAttrs(ctx, slog.LevelWarn, "cannot refresh this worker's presence in containerd; other workers may take its containers for a crashed worker's",
				slog.String("namespace", h.Namespace), slog.Any("error", err))
		}
		p.healthy = time.Time{}
	case p.healthy.IsZero():
		p.healthy = now
	}
}

// noteTwin warns when the label holds another value than the one this
// Runner wrote last: another process with the same host id refreshed it.
// Sweep itself tells their containers apart by relay.owner.
func (p *Presence) noteTwin(ctx context.Context, current string) {
	p.mu.Lock()
	twin := current != "" && p.written != "" && current != p.written
	p.mu.Unlock()
	if twin {
		p.host.Logger.LogAttrs(ctx, slog.LevelWarn, "another process uses this worker's host id: each worker sharing a containerd needs its own (relay start: RELAY_CONSUMER)",
			slog.String("host_id", p.host.HostID))
	}
}

// liveRunners holds the owner ids (LabelOwner) of this process's Runners
// from New until Stop.
var liveRunners sync.Map

// LiveRunner reports whether owner is a Runner of this process that has
// not stopped.
func LiveRunner(owner string) bool {
	_, ok := liveRunners.Load(owner)
	return ok
}

// OwnedByAnotherLiveRunner reports whether owner, a relay.owner value
// ("<pid>-<start time>-<random>"), is another Runner that may still run:
// one of this process, or a live process with its pid and start time. A
// pid equal to this process's that is not one of its Runners was a
// previous process's: a worker restarted in a container gets pid 1 again.
// An empty or foreign owner is nobody's.
func (p *Presence) OwnedByAnotherLiveRunner(ctx context.Context, owner string) bool {
	if owner == "" || owner == p.host.Owner {
		return false
	}
	if LiveRunner(owner) {
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
		p.host.Logger.LogAttrs(ctx, slog.LevelDebug, "sparing a container of another live process with this host id",
			slog.String("owner", owner))
		return true
	}
	return false
}

// OwnerPrefix returns the relay.owner prefix of process pid's Runners,
// "<pid>-<start time>", the start time empty where /proc cannot tell it.
func OwnerPrefix(pid int) string {
	start, _, _ := procStat(pid)
	return strconv.Itoa(pid) + "-" + start
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

// Parse reads a presence label value, "<Unix milliseconds>
// <owner>": the time and the owner (LabelOwner) it names.
func Parse(v string) (at time.Time, owner string, ok bool) {
	ms, owner, _ := strings.Cut(v, " ")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}, "", false
	}
	return time.UnixMilli(n), owner, true
}

// HealthyFor reports whether this Runner's own refreshes have succeeded for
// at least d: only then has every live Runner had the time to refresh its
// label after a containerd outage, and a stale label means a gone host.
func (p *Presence) HealthyFor(d time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.healthy.IsZero() && time.Since(p.healthy) >= d
}

// Withdraw stops the refresh loop and removes the label, unless another
// process with the same host id wrote it since (the Runner's Close).
func (p *Presence) Withdraw(ctx context.Context) error {
	if !p.Stop() {
		return nil
	}
	h := p.host
	ctx, cancel := h.Detached(namespaces.WithNamespace(ctx, h.Namespace))
	defer cancel()
	key := LabelPrefix + h.HostID
	labels, err := h.Client.NamespaceService().Labels(ctx, h.Namespace)
	if err != nil {
		return err
	}
	p.mu.Lock()
	mine := labels[key] == p.written
	p.mu.Unlock()
	if !mine {
		return nil // a live twin's now: it keeps its containers covered
	}
	return h.Client.NamespaceService().SetLabel(ctx, h.Namespace, key, "")
}

// Stop stops the refresh loop for good, leaving the label as it is, and
// reports whether the label was ever written. It is idempotent.
func (p *Presence) Stop() (announced bool) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	p.closed = true
	close(p.stop)
	p.mu.Unlock()
	liveRunners.Delete(p.host.Owner)
	p.once.Do(func() {}) // waits for an Announce in progress; none from now on
	if p.done == nil {
		return false
	}
	<-p.done
	return true
}
