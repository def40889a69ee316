// Package shim ends the containerd shims and frees the FIFOs that a client
// dying mid-way leaves behind (docs/operations.md "containerd"). It knows
// nothing of Runners: its Reaper is told which containers to look at.
package shim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc"

	"github.com/relaydev/relay/internal/shimproc"
)

// Each task runs under a shim process (containerd-shim-runc-v2) that
// containerd starts when the task is created and asks to exit once the task
// is deleted. When the client creating a task dies mid-call, containerd
// 1.6 can give up on the shim while the shim is still busy creating (it
// waits for the dead client's output FIFOs): containerd then forgets the
// shim without asking it to exit, and the shim stays, idle, with no task
// or container behind it. Sweeping the container such a client left
// behind therefore also ends its shim, through the shim's own socket
// (docs/operations.md "containerd").

// shimSocketDir is where containerd's shims listen, whatever containerd's
// state directory: /run/containerd/s/<hex SHA-256 of
// "<containerd address>/<namespace>/<container id>">.
const shimSocketDir = "/run/containerd/s"

// shimPollInterval paces the retries of deleting a task a shim is still
// killing.
const shimPollInterval = 50 * time.Millisecond

// shimAnswerTimeout bounds the wait for a shim's first answer. One that
// does not answer in time is still busy creating the task containerd gave
// up on (the shim holds its lock until that creation fails, up to half a
// minute): a Run's cleanup then stops it in the background, within
// shimBusyTimeout, and a Sweep leaves its container for the next sweep, so
// that neither waits for it.
const shimAnswerTimeout = 2 * time.Second

// shimBusyTimeout bounds the background stop of a busy shim.
const shimBusyTimeout = time.Minute

// ExitWait is how long a shim that containerd asked to exit may take to
// do so before it is taken for one that will not.
const ExitWait = 2 * time.Second

// Reaper ends the shims of one containerd namespace for one Runner and
// holds the readers of the FIFOs those shims wait on. It is safe for
// concurrent use.
type Reaper struct {
	client    *client.Client
	address   string // containerd's socket, which names shim sockets; "" when unknown
	namespace string
	logger    *slog.Logger

	work  sync.WaitGroup // background stops of busy shims (End)
	fifos fifoReaders    // readers of FIFOs dead clients left (fifo.go)
	// fifoDenied logs once that a shim's FIFOs may not be read (End).
	fifoDenied sync.Once
	// alone holds when each shim Sweep found without a container was
	// first seen so, by PID; owned by Sweep.
	alone struct {
		sync.Mutex
		since map[int]time.Time
	}
}

// New returns a Reaper of the shims that c's containerd starts for
// namespace; it never closes c. When c's socket path cannot be told (not
// a unix socket), the shims' sockets cannot be found and the Reaper ends
// none.
func New(c *client.Client, namespace string, logger *slog.Logger) *Reaper {
	return &Reaper{client: c, address: clientAddress(c), namespace: namespace, logger: logger}
}

// clientAddress returns the path of the socket c dials, which is the
// address containerd gives its shims when the worker sees containerd's
// socket at containerd's own path; "" when it cannot tell.
func clientAddress(c *client.Client) string {
	cc, ok := c.Conn().(*grpc.ClientConn)
	if !ok {
		return ""
	}
	addr, ok := strings.CutPrefix(cc.Target(), "unix://")
	if !ok {
		return ""
	}
	return addr
}

// shimSocket returns the path of the socket of the shim of container id.
func (r *Reaper) shimSocket(id string) string {
	sum := sha256.Sum256([]byte(filepath.Join(r.address, r.namespace, id)))
	return filepath.Join(shimSocketDir, hex.EncodeToString(sum[:]))
}

// End ends the shim of container id if one still listens: it kills and
// deletes the task the shim may still hold for id, then asks it to exit.
// Call it only when containerd has no task id: whatever the shim still runs
// is then a leftover. No shim (the normal case: containerd stopped it with
// the task) is not an error. A shim that does not answer within
// shimAnswerTimeout is still busy with a creation that containerd gave up
// on: End then reports busy, and stops it in the background when
// background is set (Wait waits for that).
func (r *Reaper) End(ctx context.Context, id string, background bool) (busy bool, err error) {
	if r.address == "" {
		return false, nil
	}
	tc, err := r.dialShim(ctx, id)
	if tc == nil || err != nil {
		return false, err
	}
	shim := taskapi.NewTTRPCTaskClient(tc)
	// A shim still waiting for the output FIFOs of a dead client, or for
	// a reader of its log, goes on once they have one (fifo.go); they stay
	// open while the shim is busy: until it is stopped, or until the sweep
	// that kept its container removes it.
	if err := r.fifos.open(fifoDir, id, r.shimPID(id)); err != nil {
		r.fifoDenied.Do(func() {
			r.logger.LogAttrs(ctx, slog.LevelWarn, "cannot read the FIFOs a containerd shim waits on: the worker needs CAP_SYS_PTRACE in the host's PID namespace to end such a shim",
				slog.String("container_id", id), slog.Any("error", err))
		})
	}
	actx, cancel := context.WithTimeout(ctx, shimAnswerTimeout)
	_, err = shim.State(actx, &taskapi.StateRequest{ID: id})
	busy = actx.Err() != nil && ctx.Err() == nil
	cancel()
	if !busy {
		defer r.fifos.close(id)
		defer tc.Close()
		return false, r.stopShim(ctx, shim, id, err)
	}
	// A later attempt uses a new connection: the ttrpc client would log
	// the late answer to this one's request as an error.
	tc.Close()
	if !background {
		return true, nil
	}
	r.work.Add(1)
	go func() {
		defer r.work.Done()
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shimBusyTimeout)
		defer cancel()
		defer r.fifos.close(id)
		err := func() error {
			tc, err := r.dialShim(bctx, id)
			if tc == nil || err != nil {
				return err
			}
			defer tc.Close()
			shim := taskapi.NewTTRPCTaskClient(tc)
			_, err = shim.State(bctx, &taskapi.StateRequest{ID: id})
			return r.stopShim(bctx, shim, id, err)
		}()
		if err != nil {
			r.logger.LogAttrs(bctx, slog.LevelError, "containerd shim cleanup failed",
				slog.String("container_id", id), slog.Any("error", err))
		}
	}()
	return true, nil
}

// Exits reports whether the shim of container id is gone (its socket
// removed, which a shim does as it exits, or no longer listened on) or
// goes within d.
func (r *Reaper) Exits(ctx context.Context, id string, d time.Duration) bool {
	if r.address == "" {
		return true
	}
	path := r.shimSocket(id)
	deadline := time.Now().Add(d)
	for {
		// A shim that died before it could remove its socket (it failed
		// early) leaves the file, with no one listening.
		conn, err := net.Dial("unix", path)
		if noShimListens(err) {
			return true
		} else if err == nil {
			conn.Close()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(shimPollInterval)
	}
}

// Sweep ends the shims of the namespace, started by the Reaper's
// containerd, that have been without their container for longer than
// grace (the task-creation grace), except those of containers isLive
// reports (a Runner's own). containerd 1.6 loses track of a shim it
// started while it was stopping: the task's creation failed, the
// container was removed, and the shim idles (or holds a created task)
// until the host reboots (docs/operations.md "containerd"). A container exists before
// its shim starts, so a shim without one is never a creation in flight;
// the grace lets the shims of containers just removed exit by themselves.
func (r *Reaper) Sweep(ctx context.Context, grace time.Duration, isLive func(id string) bool) error {
	if r.address == "" {
		return nil
	}
	r.alone.Lock()
	defer r.alone.Unlock()
	now := time.Now()
	since := make(map[int]time.Time)
	var errs []error
	for _, sh := range shimproc.List() {
		if !r.startedShim(sh) || sh.ID == "" || isLive(sh.ID) {
			continue
		}
		if _, err := r.client.LoadContainer(ctx, sh.ID); !errdefs.IsNotFound(err) {
			continue // it exists, or containerd cannot say: the container sweep's business
		}
		first, seen := r.alone.since[sh.PID]
		if !seen {
			first = now
		}
		if now.Sub(first) < grace {
			since[sh.PID] = first
			continue
		}
		r.logger.LogAttrs(ctx, slog.LevelWarn, "ending a containerd shim whose container is gone",
			slog.String("container_id", sh.ID), slog.Int("pid", sh.PID))
		if _, err := r.End(ctx, sh.ID, true); err != nil {
			since[sh.PID] = first // tried again at the next sweep
			errs = append(errs, err)
		}
	}
	r.alone.since = since
	return errors.Join(errs...)
}

// shimPID returns the PID of the shim serving container id for the
// Reaper's containerd and namespace, found by its command line, or 0 when
// there is none. It asks nothing of the shim, which may not serve
// requests yet.
func (r *Reaper) shimPID(id string) int {
	for _, sh := range shimproc.List() {
		if sh.ID == id && r.startedShim(sh) {
			return sh.PID
		}
	}
	return 0
}

// startedShim reports whether sh serves the Reaper's namespace for its
// containerd: a shim its sweeps may end.
func (r *Reaper) startedShim(sh shimproc.Shim) bool {
	return sh.Namespace == r.namespace && sh.Address == r.address
}

// dialShim connects to the shim of container id; it returns nil and no
// error when no shim listens there.
func (r *Reaper) dialShim(ctx context.Context, id string) (*ttrpc.Client, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", r.shimSocket(id))
	if err != nil {
		if noShimListens(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("connect to the shim of %s: %w", id, err)
	}
	return ttrpc.NewClient(conn), nil
}

// noShimListens reports whether err, from connecting to a shim's socket,
// means that no shim serves it: the socket is gone, or its file is left
// with no one listening.
func noShimListens(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED)
}

// stopShim ends the shim of container id, whose answer to a task state
// request was stateErr: it kills and deletes the task the shim still holds,
// if any, then asks it to exit.
func (r *Reaper) stopShim(ctx context.Context, shim taskapi.TTRPCTaskService, id string, stateErr error) (err error) {
	defer func() {
		// A shim that closes the connection mid-call is exiting (asked to
		// by containerd a moment before): done, once its socket is gone.
		if errors.Is(err, ttrpc.ErrClosed) && r.Exits(ctx, id, ExitWait) {
			err = nil
		}
	}()
	held := false
	switch err := errgrpc.ToNative(stateErr); {
	case errors.Is(stateErr, ttrpc.ErrClosed): // before ToNative, which hides it
		return fmt.Errorf("shim of %s: task state: %w", id, stateErr)
	case err == nil:
		// The shim finished creating the task after containerd gave up on
		// it: it would not exit while it holds the task.
		held = true
		if made := restoreBundle(ctx, shim, id); made != "" {
			defer os.RemoveAll(made)
		}
		if err := deleteShimTask(ctx, shim, id); err != nil {
			return fmt.Errorf("shim of %s: %w", id, err)
		}
	case !errdefs.IsNotFound(err):
		return fmt.Errorf("shim of %s: task state: %w", id, err)
	}
	// The shim may close the connection before it answers.
	if _, err := shim.Shutdown(ctx, &taskapi.ShutdownRequest{ID: id}); err != nil && !errors.Is(err, ttrpc.ErrClosed) {
		return fmt.Errorf("shim of %s: shutdown: %w", id, errgrpc.ToNative(err))
	}
	r.logger.LogAttrs(ctx, slog.LevelWarn, "stopped a containerd shim left without its task",
		slog.String("container_id", id), slog.Bool("task_killed", held))
	return nil
}

// restoreBundle recreates the bundle directory of task id when containerd
// removed it after giving up on the task's creation while the shim went on
// creating it: runc, which the shim runs to kill and delete the task, logs
// into that directory and fails without it, so the shim could never let go
// of the task nor exit. The shim runs in the bundle directory, which
// containerd renames to ".<id>" before removing it. restoreBundle returns
// the directory it made, "" when it made none.
func restoreBundle(ctx context.Context, shim taskapi.TTRPCTaskService, id string) string {
	resp, err := shim.Connect(ctx, &taskapi.ConnectRequest{ID: id})
	if err != nil || resp.ShimPid == 0 {
		return ""
	}
	cwd, err := os.Readlink(filepath.Join("/proc", strconv.FormatUint(uint64(resp.ShimPid), 10), "cwd"))
	if err != nil {
		return ""
	}
	cwd, deleted := strings.CutSuffix(cwd, " (deleted)")
	if !deleted || !filepath.IsAbs(cwd) {
		return ""
	}
	bundle := filepath.Join(filepath.Dir(cwd), id)
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return ""
	}
	return bundle
}

// deleteShimTask kills every process of task id through its shim and
// deletes the task, retrying while it is still being killed.
func deleteShimTask(ctx context.Context, shim taskapi.TTRPCTaskService, id string) error {
	_, err := shim.Kill(ctx, &taskapi.KillRequest{ID: id, Signal: uint32(syscall.SIGKILL), All: true})
	if errors.Is(err, ttrpc.ErrClosed) { // before ToNative, which hides it
		return fmt.Errorf("kill task: %w", err)
	}
	if err = errgrpc.ToNative(err); err != nil && !errdefs.IsNotFound(err) && !errdefs.IsFailedPrecondition(err) {
		return fmt.Errorf("kill task: %w", err)
	}
	for {
		_, err := shim.Delete(ctx, &taskapi.DeleteRequest{ID: id})
		if errors.Is(err, ttrpc.ErrClosed) {
			return fmt.Errorf("delete task: %w", err)
		}
		if err = errgrpc.ToNative(err); err == nil || errdefs.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("delete task: %w (%w)", err, ctx.Err())
		case <-time.After(shimPollInterval):
		}
	}
}

// Wait waits for the background stops of busy shims that End started.
func (r *Reaper) Wait() { r.work.Wait() }

// ReleaseFIFOs closes the readers End kept open for container id and
// removes the FIFOs a dead client left for it: call it once the container
// is gone, when its shim can no longer wait on them.
func (r *Reaper) ReleaseFIFOs(id string) error {
	r.fifos.close(id)
	if err := removeLeftFIFOs(fifoDir, id); err != nil {
		return fmt.Errorf("remove the FIFOs of %s: %w", id, err)
	}
	return nil
}

// Close closes every FIFO reader the Reaper holds; its Runner is closing.
func (r *Reaper) Close() { r.fifos.closeAll() }
