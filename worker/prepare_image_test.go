package worker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// The tests of this file run a Worker on the containerd Runner: an app's
// image is prepared before a version of the app serves
// (docs/apps.md#changing-apps, docs/runtimes.md#images).

// imageHandler prints the app version (V) and the attempt that ran.
const imageHandler = `echo "version=$V attempt=$RELAY_ATTEMPT"` + "\n"

// imageApp is an app of image whose handler prints version v and handles
// events of kind.
func imageApp(image, v, kind string) string {
	return fmt.Sprintf("image: %s\ncommand: [/bin/sh, /app/handler.sh]\nenv: {V: %q}\nevents:\n  - {handler: events.h, pattern: {kind: [%s]}}\n", image, v, kind)
}

// imageHarness is a worker harness on the containerd Runner of client c
// (the test namespace of containerdtest.Client when c is nil), whose apps
// root holds templates and imageHandler in each app; handler output goes
// to out, the Runner's log to the worker's.
type imageHarness struct {
	*workerHarness
	root   string
	client *client.Client
	out    *testutil.Buffer
}

func newImageHarness(t *testing.T, c *client.Client, templates map[string]string, opts ...containerd.Option) *imageHarness {
	t.Helper()
	if c == nil {
		c = containerdtest.Client(t)
	}
	h := &imageHarness{workerHarness: newWorkerHarness(t, "events"), client: c, out: &testutil.Buffer{}}
	h.root = testutil.AppsRoot(t, templates)
	for name := range templates {
		if err := os.WriteFile(filepath.Join(h.root, name, "handler.sh"), []byte(imageHandler), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	host := make([]byte, 4)
	rand.Read(host)
	out := runtime.NewOutput(h.out)
	r, err := containerd.New(c, append([]containerd.Option{
		containerd.WithNamespace(c.DefaultNamespace()),
		containerd.WithHostID("test-" + hex.EncodeToString(host)),
		containerd.WithOutput(out, out),
		containerd.WithLogger(h.cfg.Engine.Logger),
		containerd.WithStateDir(t.TempDir()),
		containerd.WithPreparedContainers(0),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	// Registered before the worker's stop, so it runs after it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("closing the runner: %v", err)
		}
	})
	h.cfg.Runner = r
	h.cfg.Apps = template.Dir(h.root)
	h.cfg.ReloadInterval = time.Hour
	h.cfg.SweepInterval = time.Hour
	return h
}

// heldBack waits until app's message was left pending for the app being
// unavailable, then lets several reclaims (MinPendingIdle 300ms) and
// rescans pass, and checks that the message is still pending and that
// app's handler never ran.
func (h *imageHarness) heldBack(app string) {
	h.t.Helper()
	testutil.WaitFor(h.t, 30*time.Second, app+"'s message left pending", func() bool {
		for line := range strings.Lines(h.logs.String()) {
			if strings.Contains(line, `msg="app unavailable; message left pending"`) && strings.Contains(line, " app="+app+" ") {
				return true
			}
		}
		return false
	})
	time.Sleep(2 * time.Second)
	if n := h.pending(); n != 1 {
		h.t.Errorf("%d messages pending, want %s's", n, app)
	}
	if n := strings.Count(h.out.String(), "["+app+"/"); n != 0 {
		h.t.Errorf("%s's handler ran %d times while it was unavailable", app, n)
	}
}

// ran returns how many times app's handler printed line.
func (h *imageHarness) ran(app, line string) int {
	return strings.Count(h.out.String(), "["+app+"/events.h] "+line+"\n")
}

// TestImageEditToAMissingImageKeepsServing: an edit of a served app's
// image: to an image that cannot be pulled leaves the previous version
// serving, so events published after it run on the previous image, and
// the log says why; once image: names a present image again, the new
// version serves.
func TestImageEditToAMissingImageKeepsServing(t *testing.T) {
	// Nothing listens on port: the pull fails at once.
	missing := fmt.Sprintf("127.0.0.1:%d/relay/missing:v2", testutil.FreePort(t))
	h := newImageHarness(t, nil, map[string]string{"users": imageApp(containerdtest.Image, "1", "a")})
	w, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 30*time.Second, "users served", func() bool {
		return w.Apps() != nil && w.Apps().Get("users").Available()
	})
	h.publish(`{"kind":"a"}`)
	testutil.WaitFor(t, 30*time.Second, "version 1 handling an event", func() bool {
		return h.ran("users", "version=1 attempt=1") == 1
	})

	writeTemplate(t, h.root, "users", imageApp(missing, "2", "a"))
	testutil.WaitFor(t, 30*time.Second, "the edit to a missing image logged as not ready", func() bool {
		return strings.Contains(h.logs.String(), `level=ERROR msg="app not ready; its previous version keeps serving" app=users`)
	})
	logs := h.logs.String()
	for _, want := range []string{"pulling " + missing + " failed", "set image: in template.yaml"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log does not say why the edit is not served (%q):\n%s", want, logs)
		}
	}
	h.publish(`{"kind":"a"}`)
	testutil.WaitFor(t, 30*time.Second, "version 1 handling the event published after the edit", func() bool {
		return h.ran("users", "version=1 attempt=1") == 2
	})
	testutil.WaitFor(t, 30*time.Second, "both events acknowledged", func() bool { return h.pending() == 0 })
	if a := w.Apps().Get("users"); a.Spec.Image != containerdtest.Image || a.Spec.Env["V"] != "1" {
		t.Errorf("serving image %q version %q, want %s version 1", a.Spec.Image, a.Spec.Env["V"], containerdtest.Image)
	}
	if n := strings.Count(h.out.String(), "version=2"); n != 0 {
		t.Errorf("the version of the missing image ran %d times", n)
	}

	writeTemplate(t, h.root, "users", imageApp(containerdtest.Image, "3", "a"))
	testutil.WaitFor(t, 30*time.Second, "version 3, of a present image, served", func() bool {
		return w.Apps().Get("users").Spec.Env["V"] == "3"
	})
	h.publish(`{"kind":"a"}`)
	testutil.WaitFor(t, 30*time.Second, "version 3 handling an event", func() bool {
		return h.ran("users", "version=3 attempt=1") == 1
	})
	if !strings.Contains(h.logs.String(), `msg="app changed" app=users`) {
		t.Errorf("version 3 not logged as changed:\n%s", h.logs)
	}
}

// TestNewAppWithAMissingImageWaitsForIt: a new app whose image is absent
// (pulling off) is unavailable, not ready, and its message stays pending
// through the reclaims without an attempt charged; once the image is
// imported, a rescan serves the app and the message runs as attempt 1.
func TestNewAppWithAMissingImageWaitsForIt(t *testing.T) {
	const ghostImage = "relay.local/ghost:v1"
	h := newImageHarness(t, nil, map[string]string{
		"users": imageApp(containerdtest.Image, "1", "a"),
		"ghost": imageApp(ghostImage, "1", "g"),
	}, containerd.WithPull(false))
	h.cfg.ReloadInterval = 300 * time.Millisecond // the rescan retries
	w, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 30*time.Second, "the apps loaded", func() bool { return w.Apps() != nil })
	if a := w.Apps().Get("ghost"); a.Available() || !strings.Contains(a.Errors.Error(), "app not ready: ") || !strings.Contains(a.Errors.Error(), ghostImage) {
		t.Fatalf("ghost, whose image is absent: errors %q, want unavailable, not ready, naming %s", a.Errors.Error(), ghostImage)
	}
	if !strings.Contains(h.logs.String(), `msg="app unavailable: not ready" app=ghost`) {
		t.Errorf("ghost not logged as not ready:\n%s", h.logs)
	}

	h.publish(`{"kind":"g"}`)
	h.publish(`{"kind":"a"}`)
	testutil.WaitFor(t, 30*time.Second, "users' event handled", func() bool {
		return h.ran("users", "version=1 attempt=1") == 1
	})
	h.heldBack("ghost")

	img, err := h.client.GetImage(t.Context(), containerdtest.Image)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.ImageService().Create(t.Context(), images.Image{Name: ghostImage, Target: img.Target()}); err != nil {
		t.Fatalf("import %s: %v", ghostImage, err)
	}
	h.readyAndRanOnce("ghost", 30*time.Second, "its image is present")
}

// readyAndRanOnce waits until the message held for app ran, once and as
// attempt 1, and the app was logged ready once when happened.
func (h *imageHarness) readyAndRanOnce(app string, within time.Duration, when string) {
	h.t.Helper()
	testutil.WaitFor(h.t, within, app+"'s message handled once "+when, func() bool {
		return h.ran(app, "version=1 attempt=1") == 1 && h.pending() == 0
	})
	if n := strings.Count(h.out.String(), "["+app+"/"); n != 1 {
		h.t.Errorf("%s's handler ran %d times, want once, as attempt 1:\n%s", app, n, h.out)
	}
	if !strings.Contains(h.logs.String(), `msg="app ready" app=`+app) {
		h.t.Errorf("%s not logged ready once %s:\n%s", app, when, h.logs)
	}
}

// TestContainerdUnreachableAtStart: a worker whose containerd does not
// answer at start has its apps not ready, their messages pending without
// an attempt charged; a rescan once containerd answers serves them.
func TestContainerdUnreachableAtStart(t *testing.T) {
	real := containerdtest.Client(t)
	// The Runner's socket is a link to containerd's, made later.
	link := filepath.Join(t.TempDir(), "containerd.sock")
	c, err := client.New(link, client.WithDefaultNamespace(real.DefaultNamespace()), client.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := newImageHarness(t, c, map[string]string{"users": imageApp(containerdtest.Image, "1", "a")})
	h.cfg.ReloadInterval = 300 * time.Millisecond
	w, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 30*time.Second, "the apps loaded", func() bool { return w.Apps() != nil })
	if a := w.Apps().Get("users"); a.Available() || !strings.Contains(a.Errors.Error(), "app not ready: ") {
		t.Fatalf("users without containerd: errors %q, want unavailable, not ready", a.Errors.Error())
	}
	h.publish(`{"kind":"a"}`)
	h.heldBack("users")

	addr := os.Getenv(containerdtest.EnvAddress)
	if err := os.Symlink(addr, link); err != nil {
		t.Fatal(err)
	}
	h.readyAndRanOnce("users", 60*time.Second, "containerd answers")
}

// TestSlowPullIsBeingPrepared: a new app whose image pull outlasts
// PrepareWait is being prepared, its message pending, and the worker
// consumes meanwhile; when the pull ends the app serves and its message
// runs as attempt 1, the image pulled once.
func TestSlowPullIsBeingPrepared(t *testing.T) {
	c := containerdtest.Client(t)
	reg := containerdtest.NewRegistry(t)
	ref := reg.Push(t, c, "relay/slow:v1")
	release := reg.Hold()
	h := newImageHarness(t, c, map[string]string{"slow": imageApp(ref, "1", "s")})
	h.cfg.PrepareWait = 100 * time.Millisecond
	w, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 30*time.Second, "the worker consuming while slow's image is pulled", func() bool {
		return strings.Contains(h.logs.String(), "engine started")
	})
	h.publish(`{"kind":"s"}`)
	if a := w.Apps().Get("slow"); a.Available() || !strings.Contains(a.Errors.Error(), "app being prepared") {
		t.Errorf("slow while its image is pulled: errors %q, want unavailable, being prepared", a.Errors.Error())
	}
	if !strings.Contains(h.logs.String(), `msg="pulling image" image=`+ref) {
		t.Errorf("slow's image not being pulled:\n%s", h.logs)
	}
	h.heldBack("slow")

	release()
	testutil.WaitFor(t, 30*time.Second, "slow's message handled once its image is pulled", func() bool {
		return h.ran("slow", "version=1 attempt=1") == 1 && h.pending() == 0
	})
	logs := h.logs.String()
	if !strings.Contains(logs, `msg="app loaded" app=slow`) || strings.Count(logs, `msg="pulling image"`) != 1 {
		t.Errorf("slow not logged loaded, or its image pulled more than once:\n%s", logs)
	}
}

// TestStopDuringAPull: a worker stopped while it pulls an app's image, in
// the background of its preparation, ends the pull and returns nil
// without logging the app loaded or not ready.
func TestStopDuringAPull(t *testing.T) {
	c := containerdtest.Client(t)
	reg := containerdtest.NewRegistry(t)
	ref := reg.Push(t, c, "relay/held:v1")
	release := reg.Hold()
	defer release()
	h := newImageHarness(t, c, map[string]string{"slow": imageApp(ref, "1", "s")})
	h.cfg.PrepareWait = 100 * time.Millisecond
	w, stop := h.run()
	testutil.WaitFor(t, 30*time.Second, "slow being prepared", func() bool {
		return w.Apps() != nil && strings.Contains(h.logs.String(), `msg="pulling image" image=`+ref)
	})
	stopWithin(t, stop, "it pulled an image")
	logs := h.logs.String()
	if strings.Contains(logs, `msg="image pulled"`) || strings.Contains(logs, `msg="app loaded" app=slow`) || strings.Contains(logs, "not ready") {
		t.Errorf("a pull cut short by the stop ended, or its app was logged loaded or not ready:\n%s", logs)
	}
}

// TestMissingImageReportedOnce: a new app whose image cannot be pulled
// yet is tried at every rescan, and the log says so once: the first pull
// and containerd's line about it at INFO, its failure at WARN with the
// image and what to do, the pulls of the rescans after it and their
// failures at DEBUG, the app not ready once. Once the image is pushed, a
// rescan pulls it, one INFO line says it is ready, and the app serves
// (docs/runtimes.md#images).
func TestMissingImageReportedOnce(t *testing.T) {
	c := containerdtest.Client(t)
	reg := containerdtest.NewRegistry(t)
	reg.Push(t, c, "relay/early:v1")
	ref := reg.Host + "/relay/late:v1"
	h := newImageHarness(t, c, map[string]string{"late": imageApp(ref, "1", "l")},
		containerd.WithPullRetryInterval(100*time.Millisecond))
	h.cfg.ReloadInterval = 300 * time.Millisecond // the rescans retry
	w, stop := h.run()
	defer stop()
	const failed = "image pull failed; tried again at the next rescan or run after retry_after"
	testutil.WaitFor(t, 30*time.Second, "three pulls of late's image failed", func() bool {
		return len(testutil.LogLevels(h.logs.String(), failed)) >= 3
	})
	logs := h.logs.String()
	for _, msg := range []string{"pulling image", failed, "fetch failed after status: 404 Not Found"} {
		got := testutil.LogLevels(logs, msg)
		if len(got) < 3 {
			t.Errorf("%d %q lines, want one per failed pull (at least 3):\n%s", len(got), msg, logs)
			continue
		}
		first := "INFO"
		if msg == failed {
			first = "WARN"
		}
		want := []string{first}
		for range got[1:] {
			want = append(want, "DEBUG")
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("levels of %q over the rescans (-want +got):\n%s\n%s", msg, diff, logs)
		}
	}
	warn := testutil.LogLine(logs, "WARN", failed)
	for _, want := range []string{"image=" + ref, "pulling " + ref + " failed", "set image: in template.yaml", "retry_after=100ms"} {
		if !strings.Contains(warn, want) {
			t.Errorf("the WARN line lacks %q: %s", want, warn)
		}
	}
	if got := testutil.LogLevels(logs, "app unavailable: not ready"); len(got) != 1 {
		t.Errorf("late logged not ready %d times, want once:\n%s", len(got), logs)
	}
	if a := w.Apps().Get("late"); a.Available() {
		t.Fatal("late served without its image")
	}

	reg.Tag(t, "relay/early:v1", "relay/late:v1")
	testutil.WaitFor(t, 30*time.Second, "late served once its image is pushed", func() bool {
		return w.Apps().Get("late").Available()
	})
	logs = h.logs.String()
	if diff := cmp.Diff([]string{"INFO"}, testutil.LogLevels(logs, "image ready")); diff != "" {
		t.Errorf("image ready lines (-want +got):\n%s\n%s", diff, logs)
	}
	if got := testutil.LogLevels(logs, failed); slices.Contains(got[1:], "WARN") {
		t.Errorf("the failure was reported at WARN more than once: %v\n%s", got, logs)
	}
}
