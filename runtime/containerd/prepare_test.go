package containerd_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// TestPreparePullsTheImage: Prepare of an app without dependencies or
// secrets pulls its absent image, with the pull's logs, so that its first
// Run pulls nothing; a second Prepare, by a new Runner, of the image now
// present sends no request to the registry.
func TestPreparePullsTheImage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	reg := containerdtest.NewRegistry(t)
	ref := reg.Push(t, f.client, "relay/prepared:v1")
	r, logs := pullRunner(t, f)
	req := f.request("events.created")
	req.Spec.Image = ref

	if err := r.Prepare(t.Context(), "users", req.Spec); err != nil {
		t.Fatalf("Prepare of an image to pull: %v", err)
	}
	if !strings.Contains(logs.String(), `msg="pulling image" image=`+ref) || !strings.Contains(logs.String(), `msg="image pulled" image=`+ref) {
		t.Fatalf("Prepare did not pull %s:\n%s", ref, logs)
	}
	if _, err := f.client.GetImage(t.Context(), ref); err != nil {
		t.Fatalf("the image after Prepare: %v", err)
	}
	pulled := reg.Requests()
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatalf("Run after Prepare: %v", err)
	}
	containerdtest.AssertClean(t, f.client)
	if n := strings.Count(logs.String(), `msg="pulling image"`); n != 1 || reg.Requests() != pulled {
		t.Errorf("Run after Prepare pulled again: %d pulls logged, %d registry requests after Prepare's %d",
			n, reg.Requests(), pulled)
	}

	r2, logs2 := pullRunner(t, f)
	if err := r2.Prepare(t.Context(), "users", req.Spec); err != nil {
		t.Fatalf("Prepare of a present image: %v", err)
	}
	if n := reg.Requests() - pulled; n != 0 || strings.Contains(logs2.String(), "pulling image") {
		t.Errorf("Prepare of a present image sent %d requests to the registry:\n%s", n, logs2)
	}
}

// TestPrepareMissingImage: with pulling off, Prepare of a present image
// succeeds and of an absent one (image: or the runtime's default) fails
// with ErrUnavailable naming the image and what to do; with pulling on,
// an image that cannot be pulled fails the same way and is not asked for
// again within the retry interval.
func TestPrepareMissingImage(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // pulling off
	req := f.request("events.created")
	if err := f.runner.Prepare(t.Context(), "users", req.Spec); err != nil {
		t.Fatalf("Prepare of the present test image without pulling: %v", err)
	}

	req.Spec.Image = "relay.local/missing:latest"
	err := f.runner.Prepare(t.Context(), "users", req.Spec)
	if !errors.Is(err, runtime.ErrUnavailable) {
		t.Fatalf("Prepare of an absent image: %v, want ErrUnavailable", err)
	}
	for _, want := range []string{"image relay.local/missing:latest: not found in containerd namespace", "pulling is off", "set image: in template.yaml"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	req.Spec.Image, req.Spec.Runtime, req.Spec.Command = "", runtime.RuntimePython3, nil
	if err := f.runner.Prepare(t.Context(), "users", req.Spec); !errors.Is(err, runtime.ErrUnavailable) || !strings.Contains(err.Error(), containerd.DefaultPython3Image) {
		t.Errorf("Prepare of a runtime app whose default image is absent: %v, want ErrUnavailable naming %s", err, containerd.DefaultPython3Image)
	}

	reg := containerdtest.NewRegistry(t)
	r, logs := pullRunner(t, f, containerd.WithPullRetryInterval(time.Hour))
	req = f.request("events.created")
	req.Spec.Image = reg.Host + "/relay/never-pushed:v1"
	for i := range 2 {
		err := r.Prepare(t.Context(), "users", req.Spec)
		if !errors.Is(err, runtime.ErrUnavailable) || !strings.Contains(err.Error(), "pulling "+req.Spec.Image+" failed") {
			t.Fatalf("Prepare %d of an image that cannot be pulled: %v, want ErrUnavailable naming it", i, err)
		}
	}
	if n := strings.Count(logs.String(), `msg="pulling image"`); n != 1 {
		t.Errorf("%d pulls within the retry interval, want 1:\n%s", n, logs)
	}
}

// TestPrepareCancelledDuringPull: a Prepare whose context ends while it
// pulls returns at once, and the pull cut short is not remembered as a
// failure: the next Prepare pulls.
func TestPrepareCancelledDuringPull(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	reg := containerdtest.NewRegistry(t)
	ref := reg.Push(t, f.client, "relay/held:v1")
	r, logs := pullRunner(t, f, containerd.WithPullRetryInterval(time.Hour))
	req := f.request("events.created")
	req.Spec.Image = ref

	release := reg.Hold()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Prepare(ctx, "users", req.Spec) }()
	testutil.WaitFor(t, time.Minute, "the pull started", func() bool {
		return strings.Contains(logs.String(), `msg="pulling image" image=`+ref)
	})
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Prepare cancelled during its pull: %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Prepare did not return when its context ended during a pull")
	}
	release()
	if err := r.Prepare(t.Context(), "users", req.Spec); err != nil {
		t.Fatalf("Prepare after a cancelled pull: %v", err)
	}
	if n := strings.Count(logs.String(), `msg="pulling image"`); n != 2 {
		t.Errorf("%d pulls, want 2: the cancelled one and a new one", n)
	}
}

// TestPrepareReportsAMissingImageOnce: the Prepares of an image that
// cannot be pulled, one per rescan, report the failure once at WARN with
// the error and when it is tried again; the pulls after it, and what
// containerd's client logs about them, are at DEBUG. Another error is
// reported again, and once the image can be pulled one INFO line says it
// is ready (docs/runtimes.md "Images").
func TestPrepareReportsAMissingImageOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	reg := containerdtest.NewRegistry(t)
	reg.Push(t, f.client, "relay/early:v1")
	logs := &testutil.Buffer{}
	r, _ := pullRunner(t, f, containerd.WithPullRetryInterval(time.Nanosecond), containerd.WithPullTimeout(2*time.Second),
		containerd.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	req := f.request("events.created")
	req.Spec.Image = reg.Host + "/relay/late:v1"

	const failed = "image pull failed; tried again at the next rescan or run after retry_after"
	for i := range 3 {
		if err := r.Prepare(t.Context(), "users", req.Spec); !errors.Is(err, runtime.ErrUnavailable) {
			t.Fatalf("Prepare %d of an image not pushed yet: %v, want ErrUnavailable", i, err)
		}
	}
	for msg, want := range map[string][]string{
		"pulling image": {"INFO", "DEBUG", "DEBUG"},
		failed:          {"WARN", "DEBUG", "DEBUG"},
		"fetch failed after status: 404 Not Found": {"INFO", "DEBUG", "DEBUG"},
	} {
		if diff := cmp.Diff(want, testutil.LogLevels(logs.String(), msg)); diff != "" {
			t.Errorf("levels of %q over three failed pulls (-want +got):\n%s\n%s", msg, diff, logs)
		}
	}
	warn := testutil.LogLine(logs.String(), "WARN", failed)
	for _, want := range []string{"image=" + req.Spec.Image, "retry_after=1ns", "failed_pulls=1",
		"pulling " + req.Spec.Image + " failed", "set image: in template.yaml"} {
		if !strings.Contains(warn, want) {
			t.Errorf("the WARN line lacks %q: %s", want, warn)
		}
	}

	// The pull now fails another way, at its time limit: reported again.
	release := reg.Hold()
	if err := r.Prepare(t.Context(), "users", req.Spec); !errors.Is(err, runtime.ErrUnavailable) || !strings.Contains(err.Error(), "WithPullTimeout") {
		t.Fatalf("Prepare of a pull held past its time limit: %v, want ErrUnavailable naming WithPullTimeout", err)
	}
	release()
	if got := testutil.LogLevels(logs.String(), failed); len(got) != 4 || got[3] != "WARN" {
		t.Errorf("another error of the pull is not reported at WARN: %v\n%s", got, logs)
	}

	// The image arrives: one INFO line says it is ready.
	reg.Tag(t, "relay/early:v1", "relay/late:v1")
	for i := range 2 {
		if err := r.Prepare(t.Context(), "users", req.Spec); err != nil {
			t.Fatalf("Prepare %d of the pushed image: %v", i, err)
		}
	}
	if diff := cmp.Diff([]string{"INFO"}, testutil.LogLevels(logs.String(), "image ready")); diff != "" {
		t.Errorf("image ready lines (-want +got):\n%s\n%s", diff, logs)
	}
	ready := testutil.LogLine(logs.String(), "INFO", "image ready")
	for _, want := range []string{"image=" + req.Spec.Image, "failed_pulls=4", "unavailable_for="} {
		if !strings.Contains(ready, want) {
			t.Errorf("the image ready line lacks %q: %s", want, ready)
		}
	}
	if got := testutil.LogLevels(logs.String(), failed); len(got) != 4 {
		t.Errorf("%d failed pulls logged, want the 4 before the push:\n%s", len(got), logs)
	}
}
