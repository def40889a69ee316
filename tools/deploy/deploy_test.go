// Package deploy_test checks the deployment files in deploy/: every YAML
// and JSON file parses, and the systemd unit, the Kubernetes manifests and
// the kustomization hold what docs/deployment.md promises — readiness on
// /readyz, the containerd socket mounted, resource requests, a grace period
// longer than the shutdown timeout and the longest handler timeout, the
// host paths containerd needs, and a Redis configuration that relay start
// accepts. kubernetes_test.go validates the manifests against Kubernetes'
// API types and renders the kustomization; image_test.go and run_test.go
// build the image of the Containerfile and run it as the Deployment does
// (docs/deployment.md "What the tests check").
//
// They are in the tools module (tools/deploy), so that Kubernetes' and
// BuildKit's modules stay out of the library's go.mod, and run in deploy/.
package deploy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/relaydev/relay/internal/keys"
)

// TestFilesParse: every YAML (all documents) and JSON file under deploy/ parses.
func TestFilesParse(t *testing.T) {
	var n int
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		switch filepath.Ext(path) {
		case ".yaml", ".yml":
			n++
			dec := yaml.NewDecoder(bytes.NewReader(b))
			for {
				var doc any
				if err := dec.Decode(&doc); err != nil {
					if !errors.Is(err, io.EOF) {
						t.Errorf("%s: %v", path, err)
					}
					break
				}
			}
		case ".json":
			n++
			if !json.Valid(b) {
				t.Errorf("%s: not valid JSON", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 5 {
		t.Errorf("only %d YAML/JSON files under deploy/", n)
	}
}

// The subset of the Kubernetes objects the checks read. Strict decoding
// of a document into these is not possible (they omit fields), so each
// check reads what it needs and fails on a zero value.
type objectMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Args    []string `yaml:"args"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
	} `yaml:"envFrom"`
	Env []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
			Add  []string `yaml:"add"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type deployment struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
	Spec       struct {
		Replicas int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata objectMeta `yaml:"metadata"`
			Spec     struct {
				TerminationGracePeriodSeconds int               `yaml:"terminationGracePeriodSeconds"`
				HostPID                       bool              `yaml:"hostPID"`
				NodeSelector                  map[string]string `yaml:"nodeSelector"`
				Containers                    []container       `yaml:"containers"`
				Volumes                       []struct {
					Name     string `yaml:"name"`
					HostPath *struct {
						Path string `yaml:"path"`
						Type string `yaml:"type"`
					} `yaml:"hostPath"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type configMap struct {
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Metadata   objectMeta        `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
}

type kustomization struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Namespace  string   `yaml:"namespace"`
	Resources  []string `yaml:"resources"`
	Labels     []struct {
		Pairs map[string]string `yaml:"pairs"`
	} `yaml:"labels"`
	Images []struct {
		Name    string `yaml:"name"`
		NewName string `yaml:"newName"`
		NewTag  string `yaml:"newTag"`
	} `yaml:"images"`
}

type pdb struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Spec       struct {
		MaxUnavailable any `yaml:"maxUnavailable"`
		MinAvailable   any `yaml:"minAvailable"`
		Selector       struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
	} `yaml:"spec"`
}

func decode(t *testing.T, path string, v any, strict bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var opts []yaml.DecodeOption
	if strict {
		opts = append(opts, yaml.Strict())
	}
	if err := yaml.UnmarshalWithOptions(b, v, opts...); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

const k8s = "kubernetes"

// TestKustomization: the kustomization lists files that exist, sets the
// namespace, and its image entry names the Deployment's image.
func TestKustomization(t *testing.T) {
	var k kustomization
	decode(t, filepath.Join(k8s, "kustomization.yaml"), &k, true)
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" || k.Namespace == "" {
		t.Errorf("kustomization header %q %q, namespace %q", k.APIVersion, k.Kind, k.Namespace)
	}
	for _, want := range []string{"deployment.yaml", "configmap.yaml"} {
		if !slices.Contains(k.Resources, want) {
			t.Errorf("resources %v lack %s", k.Resources, want)
		}
	}
	for _, r := range k.Resources {
		if _, err := os.Stat(filepath.Join(k8s, r)); err != nil {
			t.Errorf("resource %s: %v", r, err)
		}
	}
	var d deployment
	decode(t, filepath.Join(k8s, "deployment.yaml"), &d, false)
	image := d.Spec.Template.Spec.Containers[0].Image
	repo, _, _ := strings.Cut(image, ":")
	if len(k.Images) != 1 || k.Images[0].Name != repo || k.Images[0].NewTag == "" {
		t.Errorf("images %+v do not retag the Deployment's image %s", k.Images, image)
	}
	var ns struct {
		APIVersion string     `yaml:"apiVersion"`
		Kind       string     `yaml:"kind"`
		Metadata   objectMeta `yaml:"metadata"`
	}
	decode(t, filepath.Join(k8s, "namespace.yaml"), &ns, true)
	if ns.Kind != "Namespace" || ns.Metadata.Name != k.Namespace {
		t.Errorf("namespace.yaml creates %s %q, kustomization uses %q", ns.Kind, ns.Metadata.Name, k.Namespace)
	}
}

// TestDeployment checks the essentials of the worker Deployment against
// its ConfigMap.
func TestDeployment(t *testing.T) {
	var d deployment
	decode(t, filepath.Join(k8s, "deployment.yaml"), &d, false)
	var cm configMap
	decode(t, filepath.Join(k8s, "configmap.yaml"), &cm, true)
	if d.APIVersion != "apps/v1" || d.Kind != "Deployment" || cm.APIVersion != "v1" || cm.Kind != "ConfigMap" {
		t.Fatalf("kinds: %s %s, %s %s", d.APIVersion, d.Kind, cm.APIVersion, cm.Kind)
	}
	spec := d.Spec.Template.Spec
	for k, v := range d.Spec.Selector.MatchLabels {
		if d.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("selector label %s=%s is not on the pod template", k, v)
		}
	}
	if d.Spec.Replicas < 2 {
		t.Errorf("replicas %d: run at least two workers", d.Spec.Replicas)
	}
	if len(spec.NodeSelector) == 0 {
		t.Error("no nodeSelector: workers must land on nodes with containerd")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want the relay worker alone", len(spec.Containers))
	}
	c := spec.Containers[0]
	if !slices.Equal(c.Args, []string{"start"}) {
		t.Errorf("args %v, want [start]", c.Args)
	}
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].ConfigMapRef == nil || c.EnvFrom[0].ConfigMapRef.Name != cm.Metadata.Name {
		t.Errorf("envFrom does not load ConfigMap %s", cm.Metadata.Name)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			env[e.Name] = "field:" + e.ValueFrom.FieldRef.FieldPath
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name
		default:
			env[e.Name] = e.Value
		}
	}
	if env["RELAY_CONSUMER"] != "field:metadata.name" {
		t.Errorf("RELAY_CONSUMER = %q, want the pod name (one consumer per pod)", env["RELAY_CONSUMER"])
	}
	if !strings.HasPrefix(env["REDIS_PASSWORD"], "secret:") || strings.Contains(cm.Data["REDIS_URI"], ":@") {
		t.Errorf("the Redis password must come from a Secret: REDIS_PASSWORD %q", env["REDIS_PASSWORD"])
	}
	for k := range cm.Data {
		if strings.Contains(strings.ToUpper(k), "PASSWORD") {
			t.Errorf("ConfigMap holds %s: secrets go in a Secret", k)
		}
	}

	// Probes on the metrics port, which METRICS_ADDR serves.
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	_, mport, _ := strings.Cut(cm.Data["METRICS_ADDR"], ":")
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Fatalf("readinessProbe %s, want an HTTP GET of /readyz", probePath(c.ReadinessProbe))
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("livenessProbe %s, want an HTTP GET of /healthz", probePath(c.LivenessProbe))
	}
	for _, p := range []*probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			continue
		}
		port := ports[toString(p.HTTPGet.Port)]
		if port == 0 {
			port, _ = strconv.Atoi(toString(p.HTTPGet.Port))
		}
		if strconv.Itoa(port) != mport {
			t.Errorf("probe %s on port %v (%d), but METRICS_ADDR is %q", p.HTTPGet.Path, p.HTTPGet.Port, port, cm.Data["METRICS_ADDR"])
		}
	}

	// Resources: requests for the scheduler, a memory limit.
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
	sc := c.SecurityContext
	if !sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("securityContext %+v: want a read-only root, no privilege escalation, every capability dropped", sc)
	}
	// The sweep opens the FIFOs a busy shim holds through /proc/<pid>/fd:
	// it must see the node's processes and may read their descriptors.
	// Removing a container dials its shim in /run/containerd/s, mode 0600,
	// and removes the secret copies, handed over to the handler's user
	// (TestImageRunsAsDeployed fails without these).
	if want := []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "SYS_PTRACE"}; !spec.HostPID || !slices.Equal(sc.Capabilities.Add, want) {
		t.Errorf("hostPID %v, capabilities added %v: want the node's PID namespace and %v only", spec.HostPID, sc.Capabilities.Add, want)
	}

	// Graceful termination outlasts the shutdown timeout, which covers the
	// longest handler timeout.
	shutdown, err := time.ParseDuration(cm.Data["RELAY_SHUTDOWN_TIMEOUT"])
	if err != nil {
		t.Fatalf("RELAY_SHUTDOWN_TIMEOUT: %v", err)
	}
	maxHandler, err := time.ParseDuration(d.Metadata.Annotations["relay.dev/max-handler-timeout"])
	if err != nil {
		t.Fatalf("annotation relay.dev/max-handler-timeout: %v", err)
	}
	grace := time.Duration(spec.TerminationGracePeriodSeconds) * time.Second
	if shutdown < maxHandler || grace <= shutdown {
		t.Errorf("terminationGracePeriodSeconds %s, RELAY_SHUTDOWN_TIMEOUT %s, longest handler timeout %s: want grace > shutdown timeout >= handler timeout",
			grace, shutdown, maxHandler)
	}

	// Host paths: containerd's run directory (its socket, the shims'
	// sockets and the task FIFOs a sweep opens), and the state directory
	// at the same path as on the host (containerd resolves bind mounts
	// there).
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mounts := map[string]string{} // mount path -> host path
	for _, m := range c.VolumeMounts {
		if hp, ok := hostPaths[m.Name]; ok {
			mounts[m.MountPath] = hp
		}
	}
	sock := cm.Data["CONTAINERD_ADDRESS"]
	if !underSamePath(mounts, sock) || !underSamePath(mounts, "/run/containerd/s") || !underSamePath(mounts, "/run/containerd/fifo") {
		t.Errorf("CONTAINERD_ADDRESS %s, the shims' sockets and the FIFOs are not inside /run/containerd mounted at its host path (mounts %v)", sock, mounts)
	}
	for _, key := range []string{"RELAY_STATE_DIR", "RELAY_APPS", "TMPDIR"} {
		dir := cm.Data[key]
		if !underSamePath(mounts, dir) {
			t.Errorf("%s=%s is not inside a hostPath mounted at its host path (mounts %v)", key, dir, mounts)
		}
	}

	checkRedisSettings(t, cm.Data)

	// The PodDisruptionBudget selects these pods.
	var b pdb
	decode(t, filepath.Join(k8s, "poddisruptionbudget.yaml"), &b, false)
	if b.APIVersion != "policy/v1" || b.Kind != "PodDisruptionBudget" || (b.Spec.MaxUnavailable == nil) == (b.Spec.MinAvailable == nil) {
		t.Errorf("PodDisruptionBudget %+v", b)
	}
	for k, v := range b.Spec.Selector.MatchLabels {
		if d.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("PodDisruptionBudget selects %s=%s, not on the pods", k, v)
		}
	}
}

func probePath(p *probe) string {
	if p == nil || p.HTTPGet == nil {
		return "(none)"
	}
	return "GET " + p.HTTPGet.Path
}

// underSamePath reports whether dir lies inside a mount whose host path
// equals its mount path.
func underSamePath(mounts map[string]string, dir string) bool {
	for mp, hp := range mounts {
		if mp == hp && (dir == mp || strings.HasPrefix(dir, mp+"/")) {
			return true
		}
	}
	return false
}

func toString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case uint64:
		return strconv.FormatUint(v, 10)
	case int64:
		return strconv.FormatInt(v, 10)
	case int:
		return strconv.Itoa(v)
	}
	return ""
}

// checkRedisSettings applies the rules relay start applies to env: the
// required settings are there and, under Redis Cluster, every stream has a
// hash tag (docs/deployment.md#redis-cluster-one-hash-slot-per-stream).
func checkRedisSettings(t *testing.T, env map[string]string) {
	t.Helper()
	for _, k := range []string{"REDIS_URI", "REDIS_STREAM", "REDIS_GROUP"} {
		if env[k] == "" {
			t.Errorf("%s is not set", k)
		}
	}
	cluster, _ := strconv.ParseBool(env["REDIS_CLUSTER"])
	for s := range strings.SplitSeq(env["REDIS_STREAM"], ",") {
		s = strings.TrimSpace(s)
		tag, ok := keys.HashTag(s)
		if cluster && (!ok || strings.ContainsAny(tag, ":%")) {
			t.Errorf("REDIS_CLUSTER is on but stream %q has no usable hash tag", s)
		}
	}
	if mc, err := strconv.Atoi(env["MAX_CONCURRENCY"]); err != nil || mc < len(strings.Split(env["REDIS_STREAM"], ",")) {
		t.Errorf("MAX_CONCURRENCY %q: want a number at least the number of streams", env["MAX_CONCURRENCY"])
	}
}

// unitFile parses a systemd unit: section -> key -> values (in order).
func unitFile(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string][]string{}
	var section string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			out[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a key=value line in a section: %q", path, n, line)
			}
			out[section][k] = append(out[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// envFile reads KEY=value lines, skipping comments.
func envFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for line := range strings.SplitSeq(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`).MatchString(k) {
			t.Errorf("%s: bad line %q", path, line)
			continue
		}
		env[k] = v
	}
	return env
}

// TestSystemdUnit checks the unit and its environment file.
func TestSystemdUnit(t *testing.T) {
	u := unitFile(t, filepath.Join("systemd", "relay.service"))
	env := envFile(t, filepath.Join("systemd", "relay.env"))
	one := func(section, key string) string {
		v := u[section][key]
		if len(v) != 1 {
			t.Errorf("[%s] %s set %d times, want once", section, key, len(v))
			return ""
		}
		return v[0]
	}
	if !strings.HasSuffix(one("Service", "ExecStart"), "/relay start") {
		t.Errorf("ExecStart %q does not run relay start", one("Service", "ExecStart"))
	}
	if one("Service", "EnvironmentFile") == "" || one("Service", "KillSignal") != "SIGTERM" {
		t.Error("want an EnvironmentFile and KillSignal=SIGTERM")
	}
	if !strings.Contains(one("Unit", "Requires"), "containerd.service") || !strings.Contains(one("Unit", "After"), "containerd.service") {
		t.Error("the unit must require and follow containerd.service")
	}
	if one("Service", "Restart") == "" || one("Install", "WantedBy") == "" {
		t.Error("want Restart= and an [Install] WantedBy=")
	}
	if caps := one("Service", "CapabilityBoundingSet"); caps != "CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER CAP_SYS_PTRACE" {
		t.Errorf("CapabilityBoundingSet=%s, want CAP_CHOWN, CAP_DAC_OVERRIDE and CAP_FOWNER (the shims' sockets, the secret copies) and CAP_SYS_PTRACE (a busy shim's FIFOs through /proc) only", caps)
	}
	if _, ok := u["Service"]["PrivateTmp"]; ok {
		t.Error("PrivateTmp hides the files containerd must bind-mount")
	}
	stop, err := strconv.Atoi(one("Service", "TimeoutStopSec"))
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v", err)
	}
	shutdown, err := time.ParseDuration(env["RELAY_SHUTDOWN_TIMEOUT"])
	if err != nil {
		t.Fatalf("RELAY_SHUTDOWN_TIMEOUT: %v", err)
	}
	if time.Duration(stop)*time.Second <= shutdown {
		t.Errorf("TimeoutStopSec %ds does not outlast RELAY_SHUTDOWN_TIMEOUT %s", stop, shutdown)
	}
	if env["CONTAINERD_ADDRESS"] == "" || env["RELAY_APPS"] == "" {
		t.Error("relay.env must set CONTAINERD_ADDRESS and RELAY_APPS")
	}
	checkRedisSettings(t, env)
}

// TestContainerfile: the image builds the relay binary statically and
// reproducibly (-trimpath, no VCS stamp, which make image relies on) and
// runs it.
func TestContainerfile(t *testing.T) {
	b, err := os.ReadFile("Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	var froms, entry int
	var build bool
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			froms++
		case "RUN":
			if strings.Contains(line, "go build") && strings.Contains(line, "./cmd/relay") && strings.Contains(line, "CGO_ENABLED=0") {
				build = true
			}
			if strings.Contains(line, "go build") && (!strings.Contains(line, " -trimpath ") || !strings.Contains(line, " -buildvcs=false ")) {
				t.Errorf("%q: want -trimpath and -buildvcs=false (the same binary from the same source, wherever built)", line)
			}
		case "ENTRYPOINT":
			var argv []string
			if err := json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(line, f[0]))), &argv); err != nil || len(argv) == 0 || filepath.Base(argv[0]) != "relay" {
				t.Errorf("ENTRYPOINT %q: want the exec form running relay", line)
			}
			entry++
		}
	}
	if froms < 2 || !build || entry != 1 {
		t.Errorf("Containerfile: %d stages, static build of ./cmd/relay %v, %d ENTRYPOINT; want a multi-stage build of the binary", froms, build, entry)
	}
}
