// Package depstest writes app directories with dependency manifests for
// the tests of dependency builds (docs/runtimes.md#dependencies): a python3
// app installing a wheel made here from local files (the Python package
// index is not reachable from the test machines, so pip runs with
// --no-index --find-links), and a node app installing a small real package
// from the npm registry.
package depstest

import (
	"archive/zip"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The package the python3 app installs from its wheels directory.
const (
	WheelName    = "relaydemo"
	WheelVersion = "1.0"
	// WheelGreeting is what relaydemo.greet("x") returns, with "x" after it.
	WheelGreeting = "hello from relaydemo, "
)

// The npm package the node app installs: tiny, with no dependencies.
const (
	NPMPackage   = "is-number"
	NPMVersion   = "7.0.0"
	npmTarball   = "https://registry.npmjs.org/is-number/-/is-number-7.0.0.tgz"
	npmIntegrity = "sha512-41Cifkg6e8TylSpdtTpeLVMqvSBEVzTttHvERD741+pnZ8ANv0004MRL43QKPDlK9cGvNp6NZWZUBlbGXYxxng=="
)

// PythonRequirements is the requirements.txt of the python3 app.
const PythonRequirements = "# pinned, from the app's own wheels\n--no-index\n--find-links wheels\n" + WheelName + "==" + WheelVersion + "\n"

// WriteFiles writes files (path relative to dir: content) under dir,
// readable by all, as the handler user reads the app directory.
func WriteFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, src := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

// PythonApp writes into dir a requirements.txt installing relaydemo from
// dir/wheels, the wheel itself, and the files of extra.
func PythonApp(t testing.TB, dir string, extra map[string]string) {
	t.Helper()
	files := map[string]string{"requirements.txt": PythonRequirements}
	for k, v := range extra {
		files[k] = v
	}
	WriteFiles(t, dir, files)
	if err := Wheel(filepath.Join(dir, "wheels"), WheelName, WheelVersion, map[string]string{
		WheelName + "/__init__.py": "def greet(name):\n    return " + fmt.Sprintf("%q", WheelGreeting) + " + name\n",
	}); err != nil {
		t.Fatal(err)
	}
}

// Wheel writes a pure-Python wheel of project name at version holding
// files (path in the wheel: content) into dir, with its dist-info METADATA,
// WHEEL and RECORD.
func Wheel(dir, name, version string, files map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	info := name + "-" + version + ".dist-info/"
	all := map[string]string{
		info + "METADATA": "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n",
		info + "WHEEL":    "Wheel-Version: 1.0\nGenerator: relay-depstest\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
	}
	for k, v := range files {
		all[k] = v
	}
	names := make([]string, 0, len(all))
	for k := range all {
		names = append(names, k)
	}
	sort.Strings(names)
	var record strings.Builder
	for _, n := range names {
		h := sha256.Sum256([]byte(all[n]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", n, base64.RawURLEncoding.EncodeToString(h[:]), len(all[n]))
	}
	record.WriteString(info + "RECORD,,\n")
	all[info+"RECORD"] = record.String()
	names = append(names, info+"RECORD")

	f, err := os.Create(filepath.Join(dir, name+"-"+version+"-py3-none-any.whl"))
	if err != nil {
		return err
	}
	zw := zip.NewWriter(f)
	for _, n := range names {
		w, err := zw.Create(n)
		if err != nil {
			f.Close()
			return err
		}
		if _, err := w.Write([]byte(all[n])); err != nil {
			f.Close()
			return err
		}
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// NodePackageJSON and NodeLockfile are the manifest and lockfile of the
// node app, which depends on NPMPackage at NPMVersion.
const (
	NodePackageJSON = `{
  "name": "depsapp",
  "version": "1.0.0",
  "private": true,
  "dependencies": {
    "is-number": "7.0.0"
  }
}
`
	NodeLockfile = `{
  "name": "depsapp",
  "version": "1.0.0",
  "lockfileVersion": 3,
  "requires": true,
  "packages": {
    "": {
      "name": "depsapp",
      "version": "1.0.0",
      "dependencies": {
        "is-number": "7.0.0"
      }
    },
    "node_modules/is-number": {
      "version": "7.0.0",
      "resolved": "` + npmTarball + `",
      "integrity": "` + npmIntegrity + `",
      "engines": {
        "node": ">=0.12.0"
      }
    }
  }
}
`
)

// NodeApp writes into dir the node app's package.json and
// package-lock.json and the files of extra.
func NodeApp(t testing.TB, dir string, extra map[string]string) {
	t.Helper()
	files := map[string]string{"package.json": NodePackageJSON, "package-lock.json": NodeLockfile}
	for k, v := range extra {
		files[k] = v
	}
	WriteFiles(t, dir, files)
}

// CAFile returns the PEM file of CA certificates dependency builds should
// trust to reach the npm registry from this machine (WithBuildCAFile):
// RELAY_BUILD_CA_FILE, else the host's NODE_EXTRA_CA_CERTS or SSL_CERT_FILE
// (a machine behind a TLS-inspecting proxy trusts its CA through them), or
// "" when none names a file.
func CAFile() string {
	for _, v := range []string{"RELAY_BUILD_CA_FILE", "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE"} {
		if p := os.Getenv(v); p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	return ""
}
