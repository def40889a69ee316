package containerd_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/depstest"
	"github.com/relaydev/relay/internal/repeats"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// uncharged checks that err is an error the Engine charges no attempt
// for: neither a handler's exit nor an unknown outcome.
func uncharged(t *testing.T, what string, err error) {
	t.Helper()
	if _, ok := errors.AsType[*runtime.ExitError](err); ok || errors.Is(err, runtime.ErrOutcomeUnknown) {
		t.Errorf("%s on a full disk: %v, want an infrastructure error, which charges no attempt", what, err)
	}
}

const noSpace = "no space left on device"

// TestStateDirFull: a Runner whose state directory is on a full
// filesystem cannot write the bootstrap of a runtime app. Its Runs fail
// as infrastructure failures that say so, with the same text every time
// (naming the bootstrap, not a temporary file), so that the worker logs
// the repeats as one (docs/operations.md "Faults"); once space is freed
// the same Runner runs the app.
func TestStateDirFull(t *testing.T) {
	t.Parallel()
	f := newRuntimeFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, map[string]string{
		"handlers.py": "def ok(event):\n    print('ok', event['id'])\n",
	})
	state := containerdtest.Tmpfs(t, 1<<20)
	free := containerdtest.Fill(t, state)
	r, err := containerd.New(f.client, containerd.WithNamespace(f.client.DefaultNamespace()),
		containerd.WithHostID("statefull-"+randomHex(4)), containerd.WithOutput(f.stdout, f.stderr),
		containerd.WithDefaultImages(map[string]string{runtime.RuntimePython3: pythonImage}),
		containerd.WithStateDir(state), containerd.WithPull(false), containerd.WithPreparedContainers(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })
	var texts []string
	for range 3 {
		_, err := r.Run(t.Context(), f.request("handlers.ok"))
		if err == nil {
			t.Fatal("Run with a full state directory succeeded")
		}
		uncharged(t, "Run", err)
		if !strings.Contains(err.Error(), noSpace) {
			t.Errorf("Run: %v, want it to say %s", err, noSpace)
		}
		if !errors.Is(err, runtime.ErrUnavailable) {
			t.Errorf("Run: %v, want it to wrap runtime.ErrUnavailable", err)
		}
		texts = append(texts, err.Error())
	}
	t.Logf("Run: %s", texts[0])
	if texts[1] != texts[0] || texts[2] != texts[0] {
		t.Errorf("one cause, different texts, which the worker logs once each:\n%s", strings.Join(texts, "\n"))
	}
	free()
	if _, err := r.Run(t.Context(), f.request("handlers.ok")); err != nil {
		t.Fatalf("Run once space was freed: %v", err)
	}
	if !strings.Contains(f.stdout.String(), "ok 42") {
		t.Errorf("stdout: %q", f.stdout.String())
	}
}

// TestContainerdDiskFull fills the filesystem of a private containerd's
// root and state under a Runner with prepared containers and tasks
// created ahead. Attempts that take a prepared container still run; the
// others fail as infrastructure failures naming "no space left on
// device", which charge no attempt (docs/operations.md "Faults"); a sweep
// meanwhile does no harm. Once space is freed the same Runner runs
// attempts again, no container served two, and nothing is left behind.
func TestContainerdDiskFull(t *testing.T) {
	dir := containerdtest.Tmpfs(t, 64<<20)
	containerdtest.PrivateIn(t, dir)
	f := newFixture(t)
	logs := &testutil.Buffer{}
	r := f.newRunner(t, "full-"+randomHex(4), containerd.WithPreparedContainers(2),
		containerd.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	req := f.request("jobs.full")
	req.Spec.Command = []string{"/bin/sh", "-c", stallScript}
	ctx := t.Context()
	run := func(id string) error {
		req := req
		req.MessageID = id
		_, err := r.Run(ctx, req)
		return err
	}
	if err := run("first"); err != nil {
		t.Fatal(err)
	}
	waitPreTasks(t, r, f.client, 2)

	var frees []func()
	var ran []string
	failed, named := 0, 0
	// The prepared containers serve the first attempts, and the removal of
	// an earlier attempt's container frees what a creation needs now and
	// then (a busy machine lets more of them through): fill again before
	// each attempt until two have failed.
	for _, id := range []string{"f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8"} {
		if failed == 2 {
			break
		}
		// Full again: the removal of earlier attempts' containers frees
		// some space.
		frees = append(frees, containerdtest.Fill(t, dir))
		err := run(id)
		if err == nil {
			ran = append(ran, id)
			continue
		}
		// runc itself may fail without saying why ("runc did not
		// terminate successfully"): its log could not be written.
		uncharged(t, "Run "+id, err)
		failed++
		if strings.Contains(err.Error(), noSpace) {
			named++
		}
		t.Logf("Run %s: %v", id, err)
	}
	if failed == 0 {
		t.Fatal("every Run succeeded on a full disk: the test filled nothing")
	}
	if named == 0 {
		t.Errorf("no failure on the full disk says %s", noSpace)
	}
	t.Logf("on the full disk %d attempts ran (prepared containers), %d failed", len(ran), failed)
	// The two creations under way when the disk filled, then none for a
	// while: not one more per attempt, and one line at WARN for the one
	// cause, whichever temporary directory each creation named.
	if n := strings.Count(logs.String(), "preparing a container failed"); n > 2 {
		t.Errorf("%d containers failed to be prepared for %d attempts on a full disk, want at most 2:\n%s", n, failed+len(ran), logs)
	}
	if n := strings.Count(logs.String(), `level=WARN msg="preparing a container failed"`); n > 1 {
		t.Errorf("%d WARN lines for preparations that failed on one full disk, want 1 per %s:\n%s", n, repeats.Window, logs)
	}
	if err := r.Sweep(ctx); err != nil {
		t.Logf("Sweep on the full disk: %v", err)
	}

	for _, free := range frees {
		free()
	}
	for _, id := range []string{"a1", "a2", "a3"} {
		if err := run(id); err != nil {
			t.Fatalf("Run %s once space was freed: %v", id, err)
		}
		ran = append(ran, id)
	}
	out := f.stdout.String()
	if strings.Contains(out, "reused") {
		t.Errorf("a container served two attempts:\n%s", out)
	}
	for _, id := range ran {
		if n := strings.Count(out, "ran "+id+"\n"); n != 1 {
			t.Errorf("attempt %s ran %d times:\n%s", id, n, out)
		}
	}
	if err := r.Sweep(ctx); err != nil {
		t.Errorf("Sweep once space was freed: %v", err)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestSecretsStagingFull: secrets are staged under os.TempDir(); on a
// full filesystem Runs fail as infrastructure failures that say so, with
// the same text every time (naming the secret, not the staging
// directory's random name), and run again once space is freed.
func TestSecretsStagingFull(t *testing.T) {
	f := newFixture(t)
	secrets := t.TempDir()
	if err := os.WriteFile(filepath.Join(secrets, "db-password"), []byte("s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	tmp := containerdtest.Tmpfs(t, 1<<20)
	t.Setenv("TMPDIR", tmp)
	free := containerdtest.Fill(t, tmp)
	r := f.newRunner(t, "secretsfull-"+randomHex(4), containerd.WithSecretsDir(secrets))
	req := f.request("exit.now")
	req.Spec.Secrets = []string{"db-password"}
	var texts []string
	for range 2 {
		_, err := r.Run(t.Context(), req)
		if err == nil {
			t.Fatal("Run staging a secret on a full filesystem succeeded")
		}
		uncharged(t, "Run", err)
		if !strings.Contains(err.Error(), noSpace) {
			t.Errorf("Run: %v, want it to say %s", err, noSpace)
		}
		texts = append(texts, err.Error())
	}
	t.Logf("Run: %s", texts[0])
	if texts[1] != texts[0] {
		t.Errorf("one cause, different texts, which the worker logs once each:\n%s", strings.Join(texts, "\n"))
	}
	free()
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatalf("Run once space was freed: %v", err)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestRuntimeDiskFull fills the filesystem of a private containerd under
// a python3 app with dependencies and warm containers. The dependency
// build fails as an infrastructure failure saying so, and is tried again
// at the next attempt, not after the retry interval of a failed manifest;
// once space is freed it builds and a warm container serves. A warm
// container already running keeps serving on the full disk (it writes
// nothing there), while a one-shot attempt fails uncharged; everything
// runs again once space is freed, and nothing is left behind.
func TestRuntimeDiskFull(t *testing.T) {
	dir := containerdtest.Tmpfs(t, 768<<20)
	containerdtest.PrivateIn(t, dir)
	f := newRuntimeFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, nil)
	depstest.PythonApp(t, f.app, map[string]string{"handlers.py": pythonDepsHandler})
	r, log := depsRunner(t, f)
	t.Cleanup(func() { r.Close(context.Background()) })
	req := f.request("handlers.hello")
	req.Spec.Deps = depsOf(t, f.app, runtime.RuntimePython3)
	warm := req
	warm.Spec.Warm = true
	ctx := t.Context()

	free := containerdtest.Fill(t, dir)
	for i := range 2 {
		_, err := r.Run(ctx, warm)
		if err == nil {
			t.Fatal("a dependency build on a full disk succeeded")
		}
		uncharged(t, "a dependency build", err)
		if !strings.Contains(err.Error(), noSpace) {
			t.Errorf("a dependency build on a full disk: %v, want it to say %s", err, noSpace)
		}
		t.Logf("Run %d: %v", i, err)
	}
	if n := strings.Count(log.String(), "building dependency image"); n != 2 {
		t.Errorf("%d builds for two attempts on a full disk, want 2: not remembered as the manifest's failure\nlog:\n%s", n, log)
	}
	free()
	if _, err := r.Run(ctx, warm); err != nil {
		t.Fatalf("warm Run once space was freed: %v\nlog:\n%s", err, log)
	}

	free = containerdtest.Fill(t, dir)
	if _, err := r.Run(ctx, warm); err != nil {
		t.Errorf("the running warm container on a full disk: %v", err)
	}
	_, err := r.Run(ctx, req)
	if err == nil {
		t.Fatal("a one-shot Run on a full disk succeeded")
	}
	uncharged(t, "a one-shot Run", err)
	t.Logf("one-shot Run on the full disk: %v", err)
	free()
	if _, err := r.Run(ctx, req); err != nil {
		t.Fatalf("one-shot Run once space was freed: %v", err)
	}
	if n := strings.Count(lines(f.stdout, "handlers.hello"), depstest.WheelGreeting); n != 3 {
		t.Errorf("%d greetings, want 3 (warm twice, one-shot once)", n)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Sweep(ctx); err != nil {
		t.Error(err)
	}
	containerdtest.AssertClean(t, f.client)
}
