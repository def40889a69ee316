package deploy_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
)

// The app the worker runs in TestImageRunsAsDeployed: handlers in
// relay.local/busybox:latest containers, each checking the secret the
// Secret volume provides, handed to its user (docs/apps.md#secrets).
const runApp = `
image: ` + containerdtest.Image + `
command: ["/bin/sh", "/app/handler.sh"]
concurrency: 4
secrets: [token]
events:
  - {handler: ok.run, pattern: {kind: [ok]}, timeout: 60s, retries: 0}
  - {handler: bad.run, pattern: {kind: [bad]}, timeout: 60s, retries: 0}
  - {handler: slow.run, pattern: {kind: [slow]}, timeout: 60s, retries: 0}
`

const runHandler = `cat >/dev/null
[ "$(cat /run/secrets/token)" = s3cret ] || { echo "no secret" >&2; exit 4; }
[ "$(stat -c %u:%a /run/secrets/token)" = "$(id -u):400" ] || { echo "secret not handed over: $(stat -c %u:%a /run/secrets/token)" >&2; exit 5; }
case "$RELAY_HANDLER" in
bad.run) echo "planned failure" >&2; exit 3 ;;
slow.run) sleep 3 ;;
esac
`

// rendered returns the Deployment and the ConfigMap kustomize renders from
// deploy/kubernetes, decoded into Kubernetes' types.
func rendered(t *testing.T) (*appsv1.Deployment, *corev1.ConfigMap) {
	t.Helper()
	s := k8sScheme(t)
	var d *appsv1.Deployment
	var cm *corev1.ConfigMap
	for _, doc := range renderKustomization(t) {
		obj, err := decodeObject(t, s, doc)
		if err != nil {
			t.Fatal(err)
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			d = o
		case *corev1.ConfigMap:
			cm = o
		}
	}
	if d == nil || cm == nil {
		t.Fatal("kustomize rendered no Deployment or no ConfigMap")
	}
	return d, cm
}

// podSpecOpts turns the pod's container settings into the OCI spec the
// kubelet would ask containerd for: user, capabilities (drop ALL, add the
// listed ones), no new privileges, a read-only root, containerd's default
// seccomp profile (RuntimeDefault), the node's PID namespace and the
// memory limit.
func podSpecOpts(t *testing.T, pod *corev1.PodSpec, c *corev1.Container) []oci.SpecOpts {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.RunAsUser == nil || sc.RunAsGroup == nil || sc.Capabilities == nil {
		t.Fatal("the container has no runAsUser, runAsGroup or capabilities: this test runs what the manifest sets")
	}
	opts := []oci.SpecOpts{oci.WithUIDGID(uint32(*sc.RunAsUser), uint32(*sc.RunAsGroup))}
	if !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Fatalf("capabilities drop %v: this test knows drop [ALL] only", sc.Capabilities.Drop)
	}
	var caps []string
	for _, c := range sc.Capabilities.Add {
		caps = append(caps, "CAP_"+string(c))
	}
	opts = append(opts, oci.WithCapabilities(caps))
	if p := sc.AllowPrivilegeEscalation; p != nil && !*p {
		opts = append(opts, oci.WithNoNewPrivileges)
	}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		opts = append(opts, oci.WithRootFSReadonly())
	}
	if sp := sc.SeccompProfile; sp != nil && sp.Type == corev1.SeccompProfileTypeRuntimeDefault {
		opts = append(opts, seccomp.WithDefaultProfile())
	}
	if pod.HostPID {
		opts = append(opts, oci.WithHostNamespace(specs.PIDNamespace))
	}
	if m, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		opts = append(opts, oci.WithMemoryLimit(uint64(m.Value())))
	}
	return opts
}

// TestImageRunsAsDeployed runs the relay image under containerd as
// deploy/kubernetes runs it — the container settings and mounts of the
// rendered Deployment, the environment of its ConfigMap and the Secret
// volumes — and checks that:
//   - handlers run as sibling containers of the node's containerd, with
//     the app secret the Secret volume holds;
//   - every event is handled and acknowledged, failures dead-lettered;
//   - /readyz answers ready, /metrics counts the stream and relay health
//     run in the container passes;
//   - SIGTERM lets a running handler finish and the worker exits 0 within
//     terminationGracePeriodSeconds;
//   - no container, task or active snapshot of the run is left, nor a
//     secret copy on the node.
//
// Where a test machine is not a node, the hostPath volumes are moved under
// a temporary directory (each still mounted at its host path, as
// containerd resolves the handlers' bind mounts on the host), the
// containerd run directory is this machine's /run/containerd (task FIFOs,
// shim sockets) plus the directory of the test daemon's socket, the pod
// uses the host network to reach a Redis on loopback, and METRICS_ADDR
// is a free loopback port.
func TestImageRunsAsDeployed(t *testing.T) {
	archive, digest := relayImage(t)
	c := containerdtest.Client(t)
	ns := c.DefaultNamespace()
	ctx := namespaces.WithNamespace(t.Context(), ns)
	d, cm := rendered(t)
	pod := &d.Spec.Template.Spec
	ctr := &pod.Containers[0]

	// The image, imported as an operator would (ctr images import).
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := c.Import(ctx, f)
	f.Close()
	if err != nil {
		t.Fatalf("import %s: %v", archive, err)
	}
	if len(imgs) != 1 || imgs[0].Name != imageRef || imgs[0].Target.Digest.String() != digest {
		t.Fatalf("imported %+v, want %s at %s", imgs, imageRef, digest)
	}
	img := client.NewImage(c, imgs[0])
	if err := img.Unpack(ctx, containerdtest.Snapshotter); err != nil {
		t.Fatal(err)
	}
	imgSpec, err := img.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Redis, with the ACL user of the ConfigMap's URI and the password the
	// Secret relay-redis would hold.
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	const password = "p4ss"
	acl := []string{"on", ">" + password, "-@all", "+@stream", "+@hash", "+@sortedset", "+@scripting", "+@string", "+@keyspace", "+@connection", "+time", "+info", "+memory|usage", "~*"}
	if err := rc.Do(ctx, rc.B().AclSetuser().Username("relay").Rule(acl...).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	streamName, group := redistest.Name(t, "image"), cm.Data["REDIS_GROUP"]

	// Volumes: hostPath under root, at the same path inside; Secret
	// volumes from a directory of their keys.
	root := t.TempDir()
	sockDir := filepath.Dir(os.Getenv(containerdtest.EnvAddress))
	hostPaths := map[string]string{} // manifest host path -> test host path
	var mounts []specs.Mount
	bind := func(src, dst string, ro bool) {
		opt := "rw"
		if ro {
			opt = "ro"
		}
		mounts = append(mounts, specs.Mount{Type: "bind", Source: src, Destination: dst, Options: []string{"rbind", opt}})
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
		if v.HostPath != nil && v.HostPath.Path != "/run/containerd" {
			hostPaths[v.HostPath.Path] = filepath.Join(root, v.HostPath.Path)
		}
	}
	for _, m := range ctr.VolumeMounts {
		v := volumes[m.Name]
		switch {
		case v.HostPath != nil && v.HostPath.Path == "/run/containerd":
			if m.MountPath != "/run/containerd" {
				t.Fatalf("volume %s: /run/containerd mounted at %s, not at its host path", m.Name, m.MountPath)
			}
			if err := os.MkdirAll("/run/containerd", 0o711); err != nil {
				t.Fatal(err)
			}
			bind("/run/containerd", "/run/containerd", m.ReadOnly)
			bind(sockDir, sockDir, m.ReadOnly)
		case v.HostPath != nil:
			src := hostPaths[v.HostPath.Path]
			if err := os.MkdirAll(src, 0o755); err != nil {
				t.Fatal(err)
			}
			dst := m.MountPath
			if dst == v.HostPath.Path {
				dst = src // still the same path inside as on the host
			}
			bind(src, dst, m.ReadOnly)
		case v.Secret != nil && v.Secret.SecretName == "relay-app-secrets":
			dir := filepath.Join(t.TempDir(), "secret")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "token"), []byte("s3cret"), 0o400); err != nil {
				t.Fatal(err)
			}
			bind(dir, m.MountPath, m.ReadOnly)
		default:
			t.Fatalf("volume %s: this test does not know how to provide it", m.Name)
		}
	}
	// Environment: the ConfigMap's, host paths moved like the volumes,
	// then this test's Redis, stream, namespace and metrics port.
	metricsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(testutil.FreePort(t)))
	const podName = "relay-7d9f8-abcde"
	env := map[string]string{}
	for k, v := range cm.Data {
		for hp, tp := range hostPaths {
			if v == hp || strings.HasPrefix(v, hp+"/") {
				v = tp + strings.TrimPrefix(v, hp)
				break // the same under either of two nested volumes
			}
		}
		env[k] = v
	}
	if !strings.HasPrefix(env["CONTAINERD_ADDRESS"], "/run/containerd/") {
		t.Fatalf("CONTAINERD_ADDRESS %s is not in the mounted /run/containerd", env["CONTAINERD_ADDRESS"])
	}
	env["CONTAINERD_ADDRESS"] = os.Getenv(containerdtest.EnvAddress)
	env["CONTAINERD_NAMESPACE"] = ns
	env["REDIS_URI"] = "redis://relay@" + srv.Addr
	env["REDIS_CLUSTER"] = "false"
	env["REDIS_STREAM"] = streamName
	env["METRICS_ADDR"] = metricsAddr
	for _, e := range ctr.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = podName
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == "relay-redis":
			env[e.Name] = password
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		default:
			t.Fatalf("env %s: this test does not know its source", e.Name)
		}
	}
	var envList []string
	for k, v := range env {
		envList = append(envList, k+"="+v)
	}
	slices.Sort(envList)

	// The app, on the "node".
	appDir := filepath.Join(env["RELAY_APPS"], "shop")
	if err := os.MkdirAll(appDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"template.yaml": runApp, "handler.sh": runHandler} {
		if err := os.WriteFile(filepath.Join(appDir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for dir := appDir; dir != "/"; dir = filepath.Dir(dir) {
		os.Chmod(dir, 0o755) // t.TempDir is 0700; the apps must be readable by the handlers' user
	}

	// The worker container: the image's entrypoint with the manifest's
	// args, the pod's settings, and the host network (this test only).
	// The pod's settings come after the image's, so runAsUser wins.
	opts := append([]oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithProcessArgs(append(slices.Clone(imgSpec.Config.Entrypoint), ctr.Args...)...),
		oci.WithEnv(envList),
		oci.WithMounts(mounts),
		oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostHostsFile, oci.WithHostResolvconf,
	}, podSpecOpts(t, pod, ctr)...)
	id := "relay-worker-" + strconv.Itoa(os.Getpid())
	cont, err := c.NewContainer(ctx, id, client.WithImage(img), client.WithNewSnapshot(id, img), client.WithNewSpec(opts...))
	if err != nil {
		t.Fatal(err)
	}
	logs := &testutil.Buffer{}
	task, err := cont.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, logs, logs)))
	if err != nil {
		cont.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup)
		t.Fatal(err)
	}
	removed := false
	remove := func() {
		if removed {
			return
		}
		removed = true
		cctx := context.WithoutCancel(ctx)
		if _, err := task.Delete(cctx, client.WithProcessKill); err != nil {
			t.Errorf("delete the worker's task: %v", err)
		}
		if err := cont.Delete(cctx, client.WithSnapshotCleanup); err != nil {
			t.Errorf("delete the worker's container: %v", err)
		}
	}
	t.Cleanup(func() {
		remove()
		if t.Failed() {
			t.Logf("worker output:\n%s", logs)
		}
	})
	exited, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}

	// Ready: /readyz answers while Redis and containerd do.
	testutil.WaitFor(t, 2*time.Minute, "/readyz to answer ready", func() bool {
		select {
		case st := <-exited:
			t.Fatalf("the worker exited with %d before it was ready", st.ExitCode())
		default:
		}
		code, body := get(metricsAddr, "/readyz")
		return code == http.StatusOK && strings.TrimSpace(body) == "ready"
	})

	// relay health in the pod (kubectl exec <pod> -- relay health).
	if out, code := execInTask(t, ctx, cont, task, "relay", "health"); code != 0 {
		t.Errorf("relay health in the container exited %d:\n%s", code, out)
	} else {
		t.Logf("relay health in the container:\n%s", out)
	}

	// Events: every ok one handled, every bad one dead-lettered once.
	const okEvents, badEvents = 6, 2
	var last string
	publish := func(kind string, n int) string {
		id, err := rc.Do(ctx, rc.B().Xadd().Key(streamName).Id("*").FieldValue().
			FieldValue("event", fmt.Sprintf(`{"kind":%q,"n":%d}`, kind, n)).Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	for i := range okEvents + badEvents {
		kind := "ok"
		if i%4 == 3 {
			kind = "bad"
		}
		last = publish(kind, i)
	}
	testutil.WaitFor(t, 2*time.Minute, "every event acknowledged", func() bool {
		return redistest.Settled(ctx, rc, streamName, group, last)
	})
	entries, err := redisdlq.NewStore(rc, streamName).List(ctx, dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Handler != "bad.run" || e.App != "shop" || e.HandlerAttempts != 1 || e.Consumer != podName {
			t.Errorf("dead letter %+v: want only bad.run's, one attempt each, by consumer %s", e, podName)
		}
	}
	if len(entries) != badEvents {
		t.Errorf("%d dead letters, want %d", len(entries), badEvents)
	}
	_, metrics := get(metricsAddr, "/metrics")
	if !slices.Contains(strings.Split(metrics, "\n"), "relay_events_received_total "+strconv.Itoa(okEvents+badEvents)) {
		t.Errorf("/metrics does not count %d events of %s:\n%s", okEvents+badEvents, streamName, grepLines(metrics, "relay_events_received_total"))
	}

	// A slow handler runs in a container of its own beside the worker's;
	// SIGTERM then lets it finish before the worker exits.
	slow := publish("slow", 0)
	var handlerID string
	testutil.WaitFor(t, time.Minute, "the slow handler's container to run", func() bool {
		handlerID = runningHandler(ctx, c, id)
		return handlerID != ""
	})
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	sent := time.Now()
	if err := task.Kill(ctx, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case st := <-exited:
		if st.ExitCode() != 0 {
			t.Errorf("the worker exited %d after SIGTERM, want 0", st.ExitCode())
		}
		t.Logf("worker stopped %s after SIGTERM (grace period %s), handler container %s drained", time.Since(sent).Round(time.Millisecond), grace, handlerID)
	case <-time.After(grace):
		t.Fatalf("the worker did not exit within terminationGracePeriodSeconds (%s) of SIGTERM", grace)
	}
	if !redistest.Settled(ctx, rc, streamName, group, slow) {
		t.Error("the slow event is not acknowledged: SIGTERM abandoned its handler")
	}
	if n, _ := redisdlq.NewStore(rc, streamName).List(ctx, dlq.Filter{}); len(n) != badEvents {
		t.Errorf("%d dead letters after the drain, want %d", len(n), badEvents)
	}

	// Nothing left: no container, task or active snapshot in the namespace
	// once the worker's own container is gone, and no secret copy on the
	// node.
	remove()
	containerdtest.AssertClean(t, c)
	left, _ := filepath.Glob(filepath.Join(env["TMPDIR"], "relay-secrets-*"))
	if len(left) > 0 {
		t.Errorf("secret copies left in TMPDIR: %v", left)
	}
}

// runningHandler returns the id of a running container of the handler
// image other than the worker's, or "".
func runningHandler(ctx context.Context, c *client.Client, worker string) string {
	conts, err := c.Containers(ctx)
	if err != nil {
		return ""
	}
	for _, ct := range conts {
		info, err := ct.Info(ctx)
		if err != nil || ct.ID() == worker || info.Image != containerdtest.Image {
			continue
		}
		task, err := ct.Task(ctx, nil)
		if err != nil {
			continue
		}
		if st, err := task.Status(ctx); err == nil && st.Status == client.Running {
			return ct.ID()
		}
	}
	return ""
}

// execInTask runs args in the running task, with the container's
// environment, and returns its output and exit code.
func execInTask(t *testing.T, ctx context.Context, cont client.Container, task client.Task, args ...string) (string, int) {
	t.Helper()
	spec, err := cont.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := *spec.Process
	p.Args = args
	out := &testutil.Buffer{}
	proc, err := task.Exec(ctx, "health", &p, cio.NewCreator(cio.WithStreams(nil, out, out)))
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Delete(context.WithoutCancel(ctx))
	done, err := proc.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Start(ctx); err != nil {
		t.Fatalf("exec %v: %v", args, err)
	}
	select {
	case st := <-done:
		proc.IO().Wait()
		return out.String(), int(st.ExitCode())
	case <-time.After(time.Minute):
		t.Fatalf("exec %v did not finish", args)
	}
	return "", -1
}

func get(addr, p string) (int, string) {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + addr + p)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func grepLines(s, substr string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
