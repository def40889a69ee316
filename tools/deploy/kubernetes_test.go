package deploy_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// The manifests are checked against the API types of Kubernetes 1.37
// (k8s.io/api v0.37, docs/deployment.md "Kubernetes"): each object is
// decoded strictly, by its apiVersion and kind, into the typed object of
// that release (an unknown field, a wrong type, a duplicate key or an API
// version the release does not serve fails), then checked with the
// apiserver's own metadata validation (k8s.io/apimachinery) and with the
// pod and workload rules below that kubectl apply would otherwise reject.

// k8sScheme knows the API groups the manifests use, at the versions
// Kubernetes 1.37 serves.
func k8sScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// decodeObject strictly decodes one YAML document into its typed object.
func decodeObject(t *testing.T, s *runtime.Scheme, doc []byte) (runtime.Object, error) {
	t.Helper()
	ser := json.NewSerializerWithOptions(json.DefaultMetaFactory, s, s, json.SerializerOptions{Yaml: true, Strict: true})
	obj, gvk, err := ser.Decode(doc, nil, nil)
	if err != nil {
		return nil, err
	}
	if gvk.Version == "" || gvk.Kind == "" {
		return nil, fmt.Errorf("no apiVersion or kind")
	}
	return obj, nil
}

// renderKustomization runs kustomize (the library kubectl apply -k uses)
// on deploy/kubernetes and returns each rendered object's YAML.
func renderKustomization(t *testing.T) [][]byte {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), k8s)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", k8s, err)
	}
	var docs [][]byte
	for _, r := range m.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b)
	}
	return docs
}

// TestKubernetesManifestsValidate decodes every manifest file strictly and
// validates the objects kustomize renders from them, which are what
// kubectl apply -k sends.
func TestKubernetesManifestsValidate(t *testing.T) {
	s := k8sScheme(t)
	files, err := filepath.Glob(filepath.Join(k8s, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(b, []byte("\n---")) {
			if _, err := decodeObject(t, s, doc); err != nil {
				t.Errorf("%s document %d: %v", f, i+1, err)
			}
		}
	}

	kinds := map[string]int{}
	for _, doc := range renderKustomization(t) {
		obj, err := decodeObject(t, s, doc)
		if err != nil {
			t.Errorf("rendered object: %v\n%s", err, doc)
			continue
		}
		var errs field.ErrorList
		switch o := obj.(type) {
		case *corev1.Namespace:
			errs = validateMeta(&o.ObjectMeta, false, apivalidation.ValidateNamespaceName)
		case *corev1.ConfigMap:
			errs = validateMeta(&o.ObjectMeta, true, apivalidation.NameIsDNSSubdomain)
			for k := range o.Data {
				errs = append(errs, invalid(field.NewPath("data").Key(k), k, validation.IsConfigMapKey(k))...)
			}
		case *appsv1.Deployment:
			errs = validateDeployment(o)
		case *policyv1.PodDisruptionBudget:
			errs = validatePDB(o)
		default:
			t.Errorf("rendered %T, which this test does not validate", obj)
		}
		kind := obj.GetObjectKind().GroupVersionKind().Kind
		kinds[kind]++
		for _, e := range errs {
			t.Errorf("%s: %v", kind, e)
		}
	}
	for _, k := range []string{"Namespace", "ConfigMap", "Deployment", "PodDisruptionBudget"} {
		if kinds[k] != 1 {
			t.Errorf("kustomize rendered %d %s, want 1 (all: %v)", kinds[k], k, kinds)
		}
	}
}

// TestKubernetesManifestsRejectMistakes: the validation above fails on the
// mistakes it exists for, so that its passing means something.
func TestKubernetesManifestsRejectMistakes(t *testing.T) {
	s := k8sScheme(t)
	b, err := os.ReadFile(filepath.Join(k8s, "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string][2]string{
		"unknown field":     {"hostPID: true", "hostPid: true"},
		"wrong type":        {"terminationGracePeriodSeconds: 330", "terminationGracePeriodSeconds: \"330\""},
		"removed API":       {"apiVersion: apps/v1", "apiVersion: extensions/v1beta1"},
		"mistyped capacity": {"memory: 512Mi", "memory: 512MB!"},
	} {
		doc := bytes.Replace(b, []byte(edit[0]), []byte(edit[1]), 1)
		if bytes.Equal(doc, b) {
			t.Fatalf("%s: %q not in deployment.yaml", name, edit[0])
		}
		_, err := decodeObject(t, s, doc)
		if err == nil {
			t.Errorf("%s (%s -> %s): decoded without error", name, edit[0], edit[1])
		}
		t.Logf("%s: %v", name, err)
	}
	obj, err := decodeObject(t, s, b)
	if err != nil {
		t.Fatal(err)
	}
	obj.(*appsv1.Deployment).Namespace = "relay" // as kustomize sets it
	if errs := validateDeployment(obj.(*appsv1.Deployment)); len(errs) > 0 {
		t.Fatalf("deployment.yaml: %v", errs.ToAggregate())
	}
	for name, edit := range map[string]func(d *appsv1.Deployment){
		"selector not on the pods": func(d *appsv1.Deployment) { d.Spec.Template.Labels = map[string]string{"app": "other"} },
		"mount of no volume":       func(d *appsv1.Deployment) { d.Spec.Template.Spec.Volumes = d.Spec.Template.Spec.Volumes[1:] },
		"probe on no port": func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].ReadinessProbe.HTTPGet.Port = intstr.FromString("admin")
		},
	} {
		d := obj.DeepCopyObject().(*appsv1.Deployment)
		edit(d)
		errs := validateDeployment(d)
		if len(errs) == 0 {
			t.Errorf("%s: validated", name)
		}
		t.Logf("%s: %v", name, errs.ToAggregate())
	}
}

func validateMeta(m *metav1.ObjectMeta, namespaced bool, name apivalidation.ValidateNameFunc) field.ErrorList {
	return apivalidation.ValidateObjectMeta(m, namespaced, name, field.NewPath("metadata"))
}

// validateSelector checks a workload's selector and that it selects the
// pod template's labels, as the apiserver does for a Deployment.
func validateSelector(sel *metav1.LabelSelector, podLabels map[string]string, fld *field.Path) field.ErrorList {
	if sel == nil || len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 {
		return field.ErrorList{field.Required(fld, "a non-empty selector")}
	}
	errs := metav1validation.ValidateLabelSelector(sel, metav1validation.LabelSelectorValidationOptions{}, fld)
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return append(errs, field.Invalid(fld, sel, err.Error()))
	}
	if podLabels != nil && !s.Matches(labels.Set(podLabels)) {
		errs = append(errs, field.Invalid(fld, sel, "does not select the pod template's labels"))
	}
	return errs
}

func validateDeployment(d *appsv1.Deployment) field.ErrorList {
	spec := field.NewPath("spec")
	errs := validateMeta(&d.ObjectMeta, true, apivalidation.NameIsDNSSubdomain)
	tmeta := spec.Child("template", "metadata")
	errs = append(errs, metav1validation.ValidateLabels(d.Spec.Template.Labels, tmeta.Child("labels"))...)
	errs = append(errs, apivalidation.ValidateAnnotations(d.Spec.Template.Annotations, tmeta.Child("annotations"))...)
	errs = append(errs, validateSelector(d.Spec.Selector, d.Spec.Template.Labels, spec.Child("selector"))...)
	if r := d.Spec.Replicas; r != nil && *r < 0 {
		errs = append(errs, field.Invalid(spec.Child("replicas"), *r, "must be >= 0"))
	}
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil {
		surge := ru.MaxSurge != nil && ru.MaxSurge.String() != "0" && ru.MaxSurge.String() != "0%"
		unavail := ru.MaxUnavailable != nil && ru.MaxUnavailable.String() != "0" && ru.MaxUnavailable.String() != "0%"
		if !surge && !unavail {
			errs = append(errs, field.Invalid(spec.Child("strategy", "rollingUpdate"), ru, "maxSurge and maxUnavailable may not both be 0"))
		}
	}
	return append(errs, validatePodSpec(&d.Spec.Template.Spec, spec.Child("template", "spec"))...)
}

// validatePodSpec applies the pod rules the manifests could break: names,
// one source per volume, mounts of declared volumes at unique absolute
// paths, ports and the named ports probes use, environment variable names,
// requests within limits, and no privilege escalation with privileges.
func validatePodSpec(p *corev1.PodSpec, fld *field.Path) field.ErrorList {
	var errs field.ErrorList
	if p.RestartPolicy != "" && p.RestartPolicy != corev1.RestartPolicyAlways {
		errs = append(errs, field.NotSupported(fld.Child("restartPolicy"), p.RestartPolicy, []string{"Always"}))
	}
	if g := p.TerminationGracePeriodSeconds; g != nil && *g < 0 {
		errs = append(errs, field.Invalid(fld.Child("terminationGracePeriodSeconds"), *g, "must be >= 0"))
	}
	volumes := map[string]bool{}
	for i, v := range p.Volumes {
		vf := fld.Child("volumes").Index(i)
		errs = append(errs, uniqueLabel(vf.Child("name"), v.Name, volumes)...)
		var sources int
		if hp := v.HostPath; hp != nil {
			sources++
			if !filepath.IsAbs(hp.Path) {
				errs = append(errs, field.Invalid(vf.Child("hostPath", "path"), hp.Path, "must be absolute"))
			}
			known := []corev1.HostPathType{"", corev1.HostPathDirectory, corev1.HostPathDirectoryOrCreate, corev1.HostPathFile,
				corev1.HostPathFileOrCreate, corev1.HostPathSocket, corev1.HostPathCharDev, corev1.HostPathBlockDev}
			if hp.Type != nil && !slices.Contains(known, *hp.Type) {
				errs = append(errs, field.NotSupported(vf.Child("hostPath", "type"), *hp.Type, known))
			}
		}
		if sec := v.Secret; sec != nil {
			sources++
			errs = append(errs, dns1123Subdomain(vf.Child("secret", "secretName"), sec.SecretName)...)
		}
		if v.ConfigMap != nil || v.EmptyDir != nil || v.Projected != nil || v.PersistentVolumeClaim != nil {
			sources++
		}
		if sources != 1 {
			errs = append(errs, field.Invalid(vf, v.Name, fmt.Sprintf("%d volume sources (this test knows hostPath, secret, configMap, emptyDir, projected, persistentVolumeClaim); want exactly 1", sources)))
		}
	}
	names := map[string]bool{}
	for i, c := range p.Containers {
		cf := fld.Child("containers").Index(i)
		errs = append(errs, uniqueLabel(cf.Child("name"), c.Name, names)...)
		if strings.TrimSpace(c.Image) == "" {
			errs = append(errs, field.Required(cf.Child("image"), ""))
		}
		ports := map[string]bool{}
		for j, port := range c.Ports {
			pf := cf.Child("ports").Index(j)
			errs = append(errs, invalid(pf.Child("containerPort"), port.ContainerPort, validation.IsValidPortNum(int(port.ContainerPort)))...)
			if port.Name != "" {
				errs = append(errs, invalid(pf.Child("name"), port.Name, validation.IsValidPortName(port.Name))...)
				if ports[port.Name] {
					errs = append(errs, field.Duplicate(pf.Child("name"), port.Name))
				}
				ports[port.Name] = true
			}
			if port.Protocol != "" && !slices.Contains([]corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}, port.Protocol) {
				errs = append(errs, field.NotSupported(pf.Child("protocol"), port.Protocol, []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}))
			}
		}
		for name, pr := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe, "startupProbe": c.StartupProbe} {
			if pr == nil || pr.HTTPGet == nil {
				continue
			}
			port := pr.HTTPGet.Port
			switch {
			case port.Type == intstr.String && !ports[port.StrVal]:
				errs = append(errs, field.Invalid(cf.Child(name, "httpGet", "port"), port.StrVal, "names no port of the container"))
			case port.Type == intstr.Int && len(validation.IsValidPortNum(port.IntValue())) > 0:
				errs = append(errs, field.Invalid(cf.Child(name, "httpGet", "port"), port.IntVal, "not a port number"))
			}
			if !strings.HasPrefix(pr.HTTPGet.Path, "/") {
				errs = append(errs, field.Invalid(cf.Child(name, "httpGet", "path"), pr.HTTPGet.Path, "must start with /"))
			}
		}
		for j, e := range c.Env {
			errs = append(errs, invalid(cf.Child("env").Index(j).Child("name"), e.Name, validation.IsEnvVarName(e.Name))...)
			if vf := e.ValueFrom; vf != nil && e.Value != "" {
				errs = append(errs, field.Invalid(cf.Child("env").Index(j), e.Name, "value and valueFrom are exclusive"))
			}
		}
		for j, ef := range c.EnvFrom {
			if ef.ConfigMapRef == nil && ef.SecretRef == nil {
				errs = append(errs, field.Required(cf.Child("envFrom").Index(j), "configMapRef or secretRef"))
			}
		}
		paths := map[string]bool{}
		for j, m := range c.VolumeMounts {
			mf := cf.Child("volumeMounts").Index(j)
			if !volumes[m.Name] {
				errs = append(errs, field.NotFound(mf.Child("name"), m.Name))
			}
			if !filepath.IsAbs(m.MountPath) || paths[m.MountPath] {
				errs = append(errs, field.Invalid(mf.Child("mountPath"), m.MountPath, "must be absolute and unique"))
			}
			paths[m.MountPath] = true
		}
		for res, limit := range c.Resources.Limits {
			if req, ok := c.Resources.Requests[res]; ok && req.Cmp(limit) > 0 {
				errs = append(errs, field.Invalid(cf.Child("resources", "requests").Key(string(res)), req.String(), "must be <= the limit "+limit.String()))
			}
		}
		if sc := c.SecurityContext; sc != nil && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
			if sc.Privileged != nil && *sc.Privileged {
				errs = append(errs, field.Invalid(cf.Child("securityContext"), "", "allowPrivilegeEscalation false with privileged"))
			}
			if sc.Capabilities != nil && slices.Contains(sc.Capabilities.Add, "SYS_ADMIN") {
				errs = append(errs, field.Invalid(cf.Child("securityContext"), "", "allowPrivilegeEscalation false with CAP_SYS_ADMIN"))
			}
		}
	}
	if len(p.Containers) == 0 {
		errs = append(errs, field.Required(fld.Child("containers"), ""))
	}
	return errs
}

func validatePDB(b *policyv1.PodDisruptionBudget) field.ErrorList {
	spec := field.NewPath("spec")
	errs := validateMeta(&b.ObjectMeta, true, apivalidation.NameIsDNSSubdomain)
	errs = append(errs, validateSelector(b.Spec.Selector, nil, spec.Child("selector"))...)
	if (b.Spec.MinAvailable == nil) == (b.Spec.MaxUnavailable == nil) {
		errs = append(errs, field.Invalid(spec, "", "set exactly one of minAvailable and maxUnavailable"))
	}
	return errs
}

func dns1123Label(f *field.Path, v string) field.ErrorList {
	return invalid(f, v, validation.IsDNS1123Label(v))
}

func dns1123Subdomain(f *field.Path, v string) field.ErrorList {
	return invalid(f, v, validation.IsDNS1123Subdomain(v))
}

// invalid turns the messages of a k8s.io/apimachinery validation function
// into errors on field f.
func invalid(f *field.Path, v any, msgs []string) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range msgs {
		errs = append(errs, field.Invalid(f, v, msg))
	}
	return errs
}

// TestKustomizeRenders: kustomize renders the kustomization with its
// namespace, common label and image tag applied to what it lists.
func TestKustomizeRenders(t *testing.T) {
	s := k8sScheme(t)
	for _, doc := range renderKustomization(t) {
		obj, err := decodeObject(t, s, doc)
		if err != nil {
			t.Fatal(err)
		}
		m := obj.(metav1.Object)
		kind := obj.GetObjectKind().GroupVersionKind().Kind
		if kind != "Namespace" && m.GetNamespace() != "relay" {
			t.Errorf("%s %s in namespace %q, want relay", kind, m.GetName(), m.GetNamespace())
		}
		if m.GetLabels()["app.kubernetes.io/part-of"] != "relay" {
			t.Errorf("%s %s lacks the label app.kubernetes.io/part-of=relay: %v", kind, m.GetName(), m.GetLabels())
		}
		if d, ok := obj.(*appsv1.Deployment); ok {
			if img := d.Spec.Template.Spec.Containers[0].Image; img != "registry.example.com/relaydev/relay:0.1.0" {
				t.Errorf("rendered image %s", img)
			}
		}
	}
}

// uniqueLabel checks that name is a DNS-1123 label not yet in seen, and
// adds it.
func uniqueLabel(f *field.Path, name string, seen map[string]bool) field.ErrorList {
	errs := dns1123Label(f, name)
	if seen[name] {
		errs = append(errs, field.Duplicate(f, name))
	}
	seen[name] = true
	return errs
}
