package containerd_test

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// pullRunner is a Runner that pulls, logging to the returned buffer.
func pullRunner(t *testing.T, f *fixture, opts ...containerd.Option) (*containerd.Runner, *testutil.Buffer) {
	t.Helper()
	logs := &testutil.Buffer{}
	opts = append([]containerd.Option{
		containerd.WithNamespace(f.client.DefaultNamespace()),
		containerd.WithHostID("test-" + randomHex(4)),
		containerd.WithOutput(syncWriter(&f.stdout), syncWriter(&f.stderr)),
		containerd.WithLogger(slog.New(slog.NewTextHandler(logs, nil))),
		containerd.WithStateDir(t.TempDir()),
		// The tests assert that nothing is left after each Run.
		containerd.WithPreparedContainers(0),
	}, opts...)
	r, err := containerd.New(f.client, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r, logs
}

// TestPull: an absent image is pulled from its registry once for
// concurrent Runs, with its progress logged, unpacked and run, and then used
// without pulling again.
func TestPull(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	reg := containerdtest.NewRegistry(t)
	ref := reg.Push(t, f.client, "relay/pulled:v1")
	r, logs := pullRunner(t, f, containerd.WithPullProgressInterval(20*time.Millisecond))

	release := reg.Hold()
	req := f.request("events.created")
	req.Spec.Image = ref
	errs := make(chan error, 3)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			_, err := r.Run(t.Context(), req)
			errs <- err
		})
	}
	// Downloads are held: the pull stays in progress until a progress
	// line was logged.
	testutil.WaitFor(t, time.Minute, "a pull progress log line", func() bool {
		return strings.Contains(logs.String(), `msg="image pull progress" image=`+ref)
	})
	release()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Run of an image to pull: %v", err)
		}
	}
	containerdtest.AssertClean(t, f.client)
	if got := strings.Count(f.stdout.String(), "[users/events.created] welcome {"); got != 3 {
		t.Errorf("%d handlers ran in the pulled image, want 3:\n%s", got, &f.stdout)
	}
	if got := strings.Count(logs.String(), `msg="pulling image"`); got != 1 {
		t.Errorf("%d pulls for 3 concurrent Runs, want 1:\n%s", got, logs)
	}
	if !strings.Contains(logs.String(), `msg="image pulled" image=`+ref) {
		t.Errorf("no end of pull logged:\n%s", logs)
	}

	// Present now: no second pull.
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(logs.String(), `msg="pulling image"`); got != 1 {
		t.Errorf("the image was pulled again (%d pulls):\n%s", got, logs)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestPullFailure: an image that cannot be pulled makes the app unavailable
// with an error naming the image and the image: override, and the pull is
// not tried again within the retry interval.
func TestPullFailure(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	reg := containerdtest.NewRegistry(t)
	ref := reg.Host + "/relay/never-pushed:v1"

	r, logs := pullRunner(t, f, containerd.WithPullRetryInterval(time.Hour))
	req := f.request("events.created")
	req.Spec.Image = ref
	for i := range 2 {
		_, err := r.Run(t.Context(), req)
		if !errors.Is(err, runtime.ErrUnavailable) {
			t.Fatalf("Run %d: got %v, want ErrUnavailable", i, err)
		}
		if _, ok := errors.AsType[*runtime.ExitError](err); ok {
			t.Fatalf("Run %d: got an ExitError: %v", i, err)
		}
		for _, want := range []string{"pulling " + ref + " failed", "set image: in template.yaml"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Run %d: error %q lacks %q", i, err, want)
			}
		}
	}
	if got := strings.Count(logs.String(), `msg="pulling image"`); got != 1 {
		t.Errorf("%d pulls within the retry interval, want 1:\n%s", got, logs)
	}
	// What containerd's client logs about the registry goes to the Runner's
	// logger too, not to standard error in another format.
	if !strings.Contains(logs.String(), `msg="fetch failed after status: 404 Not Found"`) {
		t.Errorf("containerd's log of the failed fetch is not in the Runner's log:\n%s", logs)
	}

	// The retry of a failure already reported is logged at DEBUG.
	logs = &testutil.Buffer{}
	r, _ = pullRunner(t, f, containerd.WithPullRetryInterval(time.Nanosecond),
		containerd.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	for range 2 {
		if _, err := r.Run(t.Context(), req); !errors.Is(err, runtime.ErrUnavailable) {
			t.Fatalf("got %v, want ErrUnavailable", err)
		}
	}
	if got := strings.Count(logs.String(), `msg="pulling image"`); got != 2 {
		t.Errorf("%d pulls past the retry interval, want 2:\n%s", got, logs)
	}

	// A registry that does not answer at all: the same kind of error.
	reg.Close()
	req.Spec.Image = reg.Host + "/relay/unreachable:v1"
	if _, err := r.Run(t.Context(), req); !errors.Is(err, runtime.ErrUnavailable) || !strings.Contains(err.Error(), req.Spec.Image) {
		t.Errorf("unreachable registry: got %v, want ErrUnavailable naming the image", err)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestDefaultImages: without `image`, a runtime app uses the runtime's
// public default image; with pulling off, its absence is reported with the
// image's name and the ways to provide it.
func TestDefaultImages(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for rt, want := range map[string]string{
		runtime.RuntimePython3: containerd.DefaultPython3Image,
		runtime.RuntimeNode:    containerd.DefaultNodeImage,
	} {
		req := f.request("events.created")
		req.Spec.Image, req.Spec.Runtime, req.Spec.Command = "", rt, nil
		_, err := f.run(t, req)
		if !errors.Is(err, runtime.ErrUnavailable) {
			t.Fatalf("%s: got %v, want ErrUnavailable", rt, err)
		}
		for _, s := range []string{"image " + want + ": not found in containerd namespace", "pulling is off", "set image: in template.yaml"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q lacks %q", rt, err, s)
			}
		}
	}
	if _, err := containerd.New(f.client, containerd.WithDefaultImages(map[string]string{"ruby": "ruby:3"})); err == nil {
		t.Error("WithDefaultImages accepted an unknown runtime")
	}
	if _, err := containerd.New(f.client, containerd.WithDefaultImages(map[string]string{"node": ""})); err == nil {
		t.Error("WithDefaultImages accepted an empty image")
	}
}

// TestShortImageReference: image: busybox-style short or untagged names
// find the image stored under its full name, as with docker and nerdctl.
func TestShortImageReference(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	req := f.request("events.created")
	req.Spec.Image = strings.TrimSuffix(containerdtest.Image, ":latest")
	if _, err := f.run(t, req); err != nil {
		t.Fatalf("image %s (no tag): %v", req.Spec.Image, err)
	}
	req.Spec.Image = "relay.local/Busybox"
	if _, err := f.run(t, req); !errors.Is(err, runtime.ErrUnavailable) || !strings.Contains(err.Error(), "invalid image reference") {
		t.Errorf("invalid reference: got %v, want ErrUnavailable saying it is invalid", err)
	}
}
