package containerd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc"
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
func (r *Runner) shimSocket(id string) string {
	sum := sha256.Sum256([]byte(filepath.Join(r.address, r.namespace, id)))
	return filepath.Join(shimSocketDir, hex.EncodeToString(sum[:]))
}

// endShim ends the shim of container id if one still listens: it kills and
// deletes the task the shim may still hold for id, then asks it to exit.
// Call it only once containerd has no container id any more: whatever the
// shim still runs is then a leftover. No shim (the normal case: containerd
// stopped it with the task) is not an error. It may wait for a shim that
// is still finishing a creation that containerd gave up on, until ctx ends.
func (r *Runner) endShim(ctx context.Context, id string) error {
	if r.address == "" {
		return nil
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", r.shimSocket(id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		return fmt.Errorf("connect to the shim of %s: %w", id, err)
	}
	tc := ttrpc.NewClient(conn)
	defer tc.Close()
	shim := taskapi.NewTTRPCTaskClient(tc)
	_, err = shim.State(ctx, &taskapi.StateRequest{ID: id})
	switch err = errgrpc.ToNative(err); {
	case err == nil:
		// The shim finished creating the task after containerd gave up on
		// it: it would not exit while it holds the task.
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
		slog.String("container_id", id))
	return nil
}

// deleteShimTask kills every process of task id through its shim and
// deletes the task, retrying while it is still being killed.
func deleteShimTask(ctx context.Context, shim taskapi.TTRPCTaskService, id string) error {
	_, err := shim.Kill(ctx, &taskapi.KillRequest{ID: id, Signal: uint32(syscall.SIGKILL), All: true})
	if err = errgrpc.ToNative(err); err != nil && !errdefs.IsNotFound(err) && !errdefs.IsFailedPrecondition(err) {
		return fmt.Errorf("kill task: %w", err)
	}
	for {
		_, err := shim.Delete(ctx, &taskapi.DeleteRequest{ID: id})
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
