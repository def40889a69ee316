package containerd_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

const secretScript = `s=/run/secrets/db-password
echo "sum=$(sha256sum $s | cut -d' ' -f1)"
echo "mode=$(stat -c %a $s) owner=$(stat -c %u $s)"
echo x >$s 2>/dev/null && echo secret-writable
touch /run/secrets/new 2>/dev/null && echo secrets-dir-writable
ls /run/secrets | tr '\n' ' '; echo
env | grep -qF "$(cat $s)" && echo secret-in-env
exit 0
`

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// TestSecretsMounted: the app's secrets, and only they, are files under
// /run/secrets that the handler can read and not change; a rotated secret
// is read by the next invocation; the value is in no environment variable.
func TestSecretsMounted(t *testing.T) {
	f := newFixture(t)
	secrets := t.TempDir()
	const v1, v2 = "s3cr3t-value-one", "s3cr3t-value-two"
	write := func(name, v string) {
		if err := os.WriteFile(filepath.Join(secrets, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("db-password", v1)
	write("other-app-key", "not-for-this-app")
	if err := os.WriteFile(filepath.Join(f.dir, "secret.sh"), []byte(secretScript), 0o644); err != nil {
		t.Fatal(err)
	}
	r := f.newRunner(t, "test-"+randomHex(4), containerd.WithSecretsDir(secrets))
	req := f.request("secret.check")
	req.Spec.Command = []string{"/bin/sh", "/app/secret.sh"}
	req.Spec.Secrets = []string{"db-password"}
	if err := r.Prepare(t.Context(), "users", req.Spec); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatalf("Run: %v\nstderr: %s", err, f.stderr.String())
	}
	out := f.stdout.String()
	for _, want := range []string{"sum=" + sum(v1), "mode=400 owner=65534", "db-password \n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"secret-writable", "secrets-dir-writable", "secret-in-env", "other-app-key"} {
		if strings.Contains(out, bad) {
			t.Errorf("output has %q:\n%s", bad, out)
		}
	}
	write("db-password", v2)
	f.stdout.Reset()
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatalf("Run after rotation: %v", err)
	}
	if out := f.stdout.String(); !strings.Contains(out, "sum="+sum(v2)) {
		t.Errorf("rotated secret not seen by the next invocation:\n%s", out)
	}
	containerdtest.AssertClean(t, f.client)
	// No staged copy is left on the host.
	left, _ := filepath.Glob(filepath.Join(os.TempDir(), "relay-secrets-*", "s", "db-password"))
	for _, p := range left {
		if b, _ := os.ReadFile(p); string(b) == v1 || string(b) == v2 {
			t.Errorf("staged secret left at %s", p)
		}
	}
}

// TestSecretMissing: an app naming a secret that is not in the secrets
// directory is unavailable (its messages stay pending) with a reason
// naming the secret and the directory.
func TestSecretMissing(t *testing.T) {
	f := newFixture(t)
	secrets := t.TempDir()
	r := f.newRunner(t, "test-"+randomHex(4), containerd.WithSecretsDir(secrets))
	req := f.request("events.created")
	req.Spec.Secrets = []string{"api-key"}
	for name, err := range map[string]error{
		"Prepare": r.Prepare(t.Context(), "users", req.Spec),
		"Run":     func() error { _, err := r.Run(t.Context(), req); return err }(),
	} {
		if !errors.Is(err, runtime.ErrUnavailable) {
			t.Fatalf("%s: %v, want ErrUnavailable", name, err)
		}
		if !strings.Contains(err.Error(), `secret "api-key"`) || !strings.Contains(err.Error(), secrets) {
			t.Errorf("%s: error %q does not name the secret and the directory", name, err)
		}
	}
}

// TestSecretsWarm: a warm container reads a rotated secret at its next
// invocation, and its spec and labels hold no secret value.
func TestSecretsWarm(t *testing.T) {
	const v1, v2 = "warm-secret-one", "warm-secret-two"
	files := map[string]string{"handlers.py": `
def read(event):
    print("secret=" + open("/run/secrets/api-key").read())
`}
	secrets := t.TempDir()
	write := func(v string) {
		if err := os.WriteFile(filepath.Join(secrets, "api-key"), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(v1)
	f := newWarmFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, files, containerd.WithSecretsDir(secrets))
	req := f.warmRequest("handlers.read", "1-0")
	req.Spec.Secrets = []string{"api-key"}
	if _, err := f.runner.Run(t.Context(), req); err != nil {
		t.Fatalf("Run: %v\n%s", err, f.stderr)
	}
	write(v2)
	if _, err := f.runner.Run(t.Context(), req); err != nil {
		t.Fatalf("Run: %v\n%s", err, f.stderr)
	}
	out := lines(f.stdout, "handlers.read")
	if !strings.Contains(out, "secret="+v1) || !strings.Contains(out, "secret="+v2) {
		t.Errorf("want both values in order, got:\n%s", out)
	}
	ids := warmContainers(t, f.client)
	if len(ids) != 1 {
		t.Fatalf("warm containers %v, want 1", ids)
	}
	c, err := f.client.LoadContainer(t.Context(), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	spec, err := c.Spec(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(struct {
		Labels map[string]string
		Spec   any
	}{info.Labels, spec})
	for _, v := range []string{v1, v2} {
		if strings.Contains(string(b), v) {
			t.Errorf("secret value in the container's labels or spec: %s", b)
		}
	}
}

// TestSweepRemovesSecretsOfGoneContainers: a staged copy that no container
// mounts, such as one left by a worker killed mid-invocation, is removed by
// a sweep once older than the task-creation grace. The copy of an
// invocation in flight, a copy younger than the grace and the copies of
// another namespace stay, and the invocation still reads its secret.
func TestSweepRemovesSecretsOfGoneContainers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	secrets := t.TempDir()
	if err := os.WriteFile(filepath.Join(secrets, "db-password"), []byte("in-flight-value"), 0o600); err != nil {
		t.Fatal(err)
	}
	ns := f.client.DefaultNamespace()
	backdate := func(root string) {
		old := time.Now().Add(-time.Hour)
		if err := os.Chtimes(root, old, old); err != nil {
			t.Fatal(err)
		}
	}
	plant := func(name string, old bool) string {
		root := filepath.Join(os.TempDir(), name)
		if err := os.MkdirAll(filepath.Join(root, "s"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "s", "db-password"), []byte("left-behind"), 0o400); err != nil {
			t.Fatal(err)
		}
		if old {
			backdate(root)
		}
		t.Cleanup(func() { os.RemoveAll(root) })
		return root
	}
	orphan := plant("relay-secrets-"+ns+"@1", true)
	young := plant("relay-secrets-"+ns+"@2", false)
	// "<ns>-b" is another namespace whose name starts with this one's.
	other := plant("relay-secrets-"+ns+"-b@3", true)
	planted := map[string]bool{orphan: true, young: true, other: true}

	r := f.newRunner(t, "sweep-"+randomHex(4), containerd.WithSecretsDir(secrets), containerd.WithTaskCreationGrace(time.Minute))
	req := f.request("secret.read")
	req.Spec.Command = []string{"/bin/sh", "-c", "sleep 2; cat /run/secrets/db-password"}
	req.Spec.Secrets = []string{"db-password"}
	done := runInBackground(t, r, req)
	ctx := t.Context()
	var inFlight string
	testutil.WaitFor(t, 10*time.Second, "the invocation's container and staged secrets", func() bool {
		conts, err := f.client.Containers(ctx)
		if err != nil || len(conts) != 1 {
			return false
		}
		roots, _ := filepath.Glob(filepath.Join(os.TempDir(), "relay-secrets-"+ns+"@*"))
		for _, root := range roots {
			if !planted[root] {
				inFlight = root
			}
		}
		return inFlight != ""
	})
	backdate(inFlight)
	if err := r.Sweep(ctx); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("staged secrets of a gone container: stat %v, want removed", err)
	}
	for what, root := range map[string]string{"younger than the grace": young, "of another namespace": other, "in flight": inFlight} {
		if _, err := os.Stat(root); err != nil {
			t.Errorf("staged secrets %s were removed: %v", what, err)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v\nstderr: %s", err, f.stderr.String())
	}
	if out := f.stdout.String(); !strings.Contains(out, "in-flight-value") {
		t.Errorf("the invocation in flight lost its secret across the sweep; output:\n%s", out)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestSecretFIFO: a secret that is a named pipe, put there after the app
// was prepared, makes the invocation unavailable at once (not a regular
// file) instead of blocking on the pipe until a writer comes, which held
// the invocation and the worker's graceful stop for ever.
func TestSecretFIFO(t *testing.T) {
	f := newFixture(t)
	secrets := t.TempDir()
	r := f.newRunner(t, "test-"+randomHex(4), containerd.WithSecretsDir(secrets))
	req := f.request("events.created")
	req.Spec.Secrets = []string{"api-key"}
	pipe := filepath.Join(secrets, "api-key")
	if err := syscall.Mkfifo(pipe, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Unblocks a Run stuck opening the pipe, so that the test ends.
		if w, err := os.OpenFile(pipe, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(t.Context(), req)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, runtime.ErrUnavailable) || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Run: %v, want ErrUnavailable, not a regular file", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run still blocked on the named pipe after a minute")
	}
	containerdtest.AssertClean(t, f.client)
}
