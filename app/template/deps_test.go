package template_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/runtime"
)

const rule = "events:\n  - handler: h.run\n    pattern: {k: [v]}\n"

// loadWith writes template.yaml and files into a fresh app directory named
// name and loads it.
func loadWith(t *testing.T, name, tpl string, files map[string]string) *app.App {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files["template.yaml"] = tpl
	for f, src := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, ok := template.LoadApp(dir)
	if !ok {
		t.Fatal("not loaded")
	}
	return a
}

func TestLoadDeps(t *testing.T) {
	py := loadWith(t, "py", "runtime: python3\n"+rule, map[string]string{
		"requirements.txt": "# comment\n--find-links wheels\n-i https://pypi.example/simple\n--extra-index=https://b.example/simple\n--no-index\t# offline\n-fwheels\n-r https://pypi.example/r.txt\n" +
			"requests==2.32.3  # pinned\nidna[all]>=3.7 ; python_version >= \"3.8\"\nsix==1.16.0 \\\n    --hash=sha256:00\n",
	})
	if !py.Available() || py.Spec.Deps == nil || py.Spec.Deps.Manifest != runtime.PythonManifest || py.Spec.Deps.Digest() == "" {
		t.Errorf("python3: errors %v, deps %+v", py.Errors, py.Spec.Deps)
	}
	node := loadWith(t, "js", "runtime: node\n"+rule, map[string]string{
		"package.json": `{"dependencies": {"ms": "2.1.3"}}`, "package-lock.json": `{"lockfileVersion": 3}`,
	})
	if !node.Available() || node.Spec.Deps == nil || node.Spec.Deps.Lockfile != runtime.NodeLockfile {
		t.Errorf("node: errors %v, deps %+v", node.Errors, node.Spec.Deps)
	}
	image := loadWith(t, "img", "image: x\n"+rule, map[string]string{"requirements.txt": "requests==2\n"})
	if !image.Available() || image.Spec.Deps != nil {
		t.Errorf("an app without runtime has no dependencies: %v %+v", image.Errors, image.Spec.Deps)
	}
	none := loadWith(t, "none", "runtime: python3\n"+rule, map[string]string{})
	if none.Spec.Deps != nil {
		t.Errorf("no manifest: deps %+v", none.Spec.Deps)
	}

	for _, c := range []struct {
		name, rt string
		files    map[string]string
		want     string
	}{
		{"badreq", "python3", map[string]string{"requirements.txt": "requests==2\nthis is not a requirement\n"},
			`badreq/requirements.txt:2:1: "this is not a requirement" is not a requirement`},
		{"editable", "python3", map[string]string{"requirements.txt": "  -e ./lib\n"},
			"editable/requirements.txt:1:3: editable requirements (-e)"},
		{"badopt", "python3", map[string]string{"requirements.txt": "--index_url https://pypi.example/simple\nrequests==2\n"},
			`badopt/requirements.txt:1:1: unknown pip option "--index_url"; a requirements file takes --index-url`},
		{"badshort", "python3", map[string]string{"requirements.txt": "requests==2\n  -x foo\n"},
			`badshort/requirements.txt:2:3: unknown pip option "-x"`},
		{"badhash", "python3", map[string]string{"requirements.txt": "six==1.16.0 --hash=sha256:00\nidna==3.7   --hsah=sha256:00\n"},
			`badhash/requirements.txt:2:13: unknown pip option "--hsah"`},
		{"continued", "python3", map[string]string{"requirements.txt": "requests==2 \\\n    --hash=sha256:00 \\\n  --index_url=https://pypi.example/simple\n"},
			`continued/requirements.txt:3:3: unknown pip option "--index_url"`},
		{"include", "python3", map[string]string{"requirements.txt": "requests==2\n-r other.txt\n", "other.txt": "idna==3.7\n"},
			`include/requirements.txt:2:1: -r other.txt: the dependency build gets requirements.txt alone`},
		{"constraint", "python3", map[string]string{"requirements.txt": "requests==2\n  --constr=c.txt\n"},
			`constraint/requirements.txt:2:3: --constraint c.txt: the dependency build gets requirements.txt alone`},
		{"ambiguous", "python3", map[string]string{"requirements.txt": "--no wheels\n"},
			`ambiguous/requirements.txt:1:1: pip option "--no" is ambiguous: --no-index, --no-binary, --no-require-hashes`},
		{"nolock", "node", map[string]string{"package.json": `{"dependencies": {}}`},
			"nolock/package.json:1:1: package.json needs a package-lock.json"},
		{"badjson", "node", map[string]string{"package.json": "{\n  \"dependencies\": {,}\n}", "package-lock.json": "{}"},
			"badjson/package.json:2:20: package.json is not a JSON object"},
		{"oldlock", "node", map[string]string{"package.json": "{}", "package-lock.json": "{}"},
			"oldlock/package-lock.json:1:1: package-lock.json has no lockfileVersion"},
	} {
		a := loadWith(t, c.name, "runtime: "+c.rt+"\n"+rule, c.files)
		if a.Available() || !strings.Contains(a.Errors.Error(), c.want) {
			t.Errorf("%s: errors %q, want %q", c.name, a.Errors.Error(), c.want)
		}
	}
}

func TestLoadSecrets(t *testing.T) {
	a := loadWith(t, "s", "image: x\nsecrets: [db-password, api.key_2]\n"+rule, map[string]string{})
	if !a.Available() || strings.Join(a.Spec.Secrets, ",") != "db-password,api.key_2" {
		t.Errorf("errors %v, secrets %v", a.Errors, a.Spec.Secrets)
	}
	for tpl, want := range map[string]string{
		"secrets: [../etc/passwd]\n": `s/template.yaml:2:11: secrets[0]: secret name "../etc/passwd" must not start with '.'`,
		"secrets: [a/b]\n":           `secrets[0]: secret name "a/b" contains '/'`,
		"secrets: [a, a]\n":          `secrets[1]: secret "a" is listed twice`,
		"secrets: db\n":              "secrets: secrets must be a list of secret names",
		"secret: [a]\n":              `unknown key "secret" (did you mean "secrets"?)`,
	} {
		a := loadWith(t, "s", "image: x\n"+tpl+rule, map[string]string{})
		if a.Available() || !strings.Contains(a.Errors.Error(), want) {
			t.Errorf("%q: errors %q, want %q", tpl, a.Errors.Error(), want)
		}
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "db-password"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A Kubernetes Secret volume holds symbolic links to the files.
	if err := os.Symlink("db-password", filepath.Join(dir, "linked")); err != nil {
		t.Fatal(err)
	}
	// A named pipe, which the worker refuses (not a regular file).
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(loadWith(t, "s", "image: x\nsecrets: [db-password, api-key, linked, pipe]\n"+rule, map[string]string{}).Spec.Dir)
	set, err := template.LoadDir(root, template.WithSecretsDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	// Each at the position of its name in the template, line 2.
	errs := set.Errors()
	if len(errs) != 2 || !strings.HasPrefix(errs[0].Error(), `s/template.yaml:2:24: secrets[1]: secret "api-key": no file api-key in the secrets directory`) ||
		!strings.HasPrefix(errs[1].Error(), `s/template.yaml:2:41: secrets[3]: secret "pipe": pipe in the secrets directory `+dir+` is not a regular file`) {
		t.Errorf("WithSecretsDir: %v", errs)
	}
}
