package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateManifestsAndSecrets: relay validate reports a broken
// dependency manifest and a bad secret name, and with --secrets-dir a
// secret that is not there.
func TestValidateManifestsAndSecrets(t *testing.T) {
	root := t.TempDir()
	write := func(app, file, src string) {
		if err := os.MkdirAll(filepath.Join(root, app), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, app, file), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const rules = "events: [{handler: a.b, pattern: {k: [v]}}]\n"
	write("js", "template.yaml", "runtime: node\nsecrets: [api-key]\n"+rules)
	write("js", "package.json", `{"dependencies": {"ms": "2.1.3"}}`)
	write("py", "template.yaml", "runtime: python3\nsecrets: [db-password]\n"+rules)
	write("py", "requirements.txt", "requests==2.32.3\n")
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"validate", "--apps", root}, &out, &errb)
	if code != exitFailure || !strings.Contains(out.String(), "js/package.json:1:1: package.json needs a package-lock.json") {
		t.Errorf("missing lockfile: code %d, output:\n%s", code, out.String())
	}
	write("js", "package-lock.json", `{"lockfileVersion": 3}`)
	out.Reset()
	if code := run(context.Background(), []string{"validate", "--apps", root}, &out, &errb); code != exitOK {
		t.Errorf("valid apps: code %d, output:\n%s", code, out.String())
	}
	secrets := t.TempDir()
	if err := os.WriteFile(filepath.Join(secrets, "db-password"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	code = run(context.Background(), []string{"validate", "--apps", root, "--secrets-dir", secrets}, &out, &errb)
	want := "js/template.yaml:2:11: secrets[0]: secret \"api-key\": no file api-key in the secrets directory " + secrets + "\n"
	if code != exitFailure || out.String() != want {
		t.Errorf("--secrets-dir: code %d, output:\n%s\nwant:\n%s", code, out.String(), want)
	}

	// The worker's variable names the directory as well as the flag.
	t.Setenv("RELAY_SECRETS_DIR", secrets)
	out.Reset()
	code = run(context.Background(), []string{"validate", "--apps", root}, &out, &errb)
	if code != exitFailure || out.String() != want {
		t.Errorf("RELAY_SECRETS_DIR: code %d, output:\n%s\nwant:\n%s", code, out.String(), want)
	}
}
