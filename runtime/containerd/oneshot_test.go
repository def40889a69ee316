package containerd_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// preparedScript reports what an attempt sees of its container: its own
// environment, and whether anything of an earlier attempt is there.
const preparedScript = `[ -e /tmp/mark ] && echo "reused /tmp"
echo "id=$RELAY_MESSAGE_ID attempt=$RELAY_ATTEMPT handler=$RELAY_HANDLER greeting=$GREETING host=$(hostname) event=$(cat)"
touch /tmp/mark
[ "$RELAY_HANDLER" = jobs.fail ] && { echo "cannot bill" >&2; exit 3; }
exit 0
`

// preparedIDs lists the containers prepared ahead of demand and not taken.
func preparedIDs(t testing.TB, c *client.Client) []string {
	t.Helper()
	conts, err := c.Containers(t.Context(), fmt.Sprintf("labels.%q==true", containerd.LabelPrepared))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ct := range conts {
		ids = append(ids, ct.ID())
	}
	slices.Sort(ids)
	return ids
}

// TestPreparedContainers: attempts of an app take containers prepared
// ahead of demand, each still with its own environment and a fresh
// rootfs; no more than the bound are ever prepared, a Spec change drops
// the previous generation's, Sweep spares them and Close removes them.
func TestPreparedContainers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if err := os.WriteFile(filepath.Join(f.dir, "prepared.sh"), []byte(preparedScript), 0o644); err != nil {
		t.Fatal(err)
	}
	r := f.newRunner(t, "prepared-"+randomHex(4), containerd.WithPreparedContainers(2))
	ctx := t.Context()
	req := f.request("jobs.run")
	req.Spec.Command = []string{"/bin/sh", "/app/prepared.sh"}

	var taken int
	for i := range 6 {
		before := preparedIDs(t, f.client)
		req.MessageID = fmt.Sprintf("1700000000000-%d", i)
		req.Attempt = i + 1
		f.stdout.Reset()
		if _, err := r.Run(ctx, req); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		out := f.stdout.String()
		want := fmt.Sprintf(`id=%s attempt=%d handler=jobs.run greeting=hello host=users event={"id":42}`, req.MessageID, i+1)
		if !strings.Contains(out, want) || strings.Contains(out, "reused") {
			t.Fatalf("run %d: stdout %q, want %q and a fresh /tmp", i, out, want)
		}
		after := preparedIDs(t, f.client)
		for _, id := range before {
			if !slices.Contains(after, id) {
				taken++
			}
		}
		if len(after) > 2 {
			t.Fatalf("run %d: %d prepared containers, bound 2: %v", i, len(after), after)
		}
		// Let the replacements come, so that later runs find one: in
		// containerd, and ready in the Runner (a container shows up a
		// moment before its task is created and it can be handed out).
		testutil.WaitFor(t, 20*time.Second, "two prepared containers", func() bool {
			return len(preparedIDs(t, f.client)) == 2 && containerd.PreparedReady(r, "users") == 2
		})
	}
	if taken < 4 {
		t.Errorf("%d of 6 runs took a prepared container, want at least 4", taken)
	}

	// A failure in a prepared container is reported like any other.
	fail := req
	fail.Handler = "jobs.fail"
	_, err := r.Run(ctx, fail)
	if ee, ok := errors.AsType[*runtime.ExitError](err); !ok || ee.Code != 3 || ee.Stderr != "cannot bill" {
		t.Errorf("failing handler in a prepared container: got %v, want exit 3 with stderr \"cannot bill\"", err)
	}
	testutil.WaitFor(t, 20*time.Second, "two prepared containers", func() bool { return len(preparedIDs(t, f.client)) == 2 })

	if err := r.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	old := preparedIDs(t, f.client)
	if len(old) != 2 {
		t.Fatalf("Sweep removed prepared containers of a live Runner: %v left", old)
	}

	// A new generation of the app: the old prepared containers go.
	req.Spec.Env = map[string]string{"GREETING": "hi"}
	f.stdout.Reset()
	if _, err := r.Run(ctx, req); err != nil {
		t.Fatal(err)
	}
	if out := f.stdout.String(); !strings.Contains(out, "greeting=hi") {
		t.Errorf("after the Spec change: stdout %q, want greeting=hi", out)
	}
	testutil.WaitFor(t, 20*time.Second, "the previous generation's prepared containers removed", func() bool {
		ids := preparedIDs(t, f.client)
		return !slices.ContainsFunc(ids, func(id string) bool { return slices.Contains(old, id) }) && len(ids) == 2
	})

	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestPreparedContainersExpire: an app that stops running loses its
// prepared containers after the idle timeout.
func TestPreparedContainersExpire(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := f.newRunner(t, "prepared-idle-"+randomHex(4), containerd.WithPreparedContainers(1),
		containerd.WithWarmIdleTimeout(5*time.Second))
	if _, err := r.Run(t.Context(), f.request("exit.now")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "a prepared container", func() bool { return len(preparedIDs(t, f.client)) == 1 })
	containerdtest.AssertClean(t, f.client)
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
}
