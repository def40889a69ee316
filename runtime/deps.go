package runtime

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Dependency manifests of the language runtimes (docs/runtimes.md
// "Dependencies").
const (
	// PythonManifest is a python3 app's list of pinned requirements.
	PythonManifest = "requirements.txt"
	// NodeManifest and NodeLockfile describe a node app's packages; the
	// lockfile is required, so that every build installs the same tree.
	NodeManifest = "package.json"
	NodeLockfile = "package-lock.json"
)

// DepsDir is where an app's installed dependencies are in its containers:
// DepsDir/python is on PYTHONPATH, DepsDir/node_modules on NODE_PATH
// (docs/runtimes.md "Dependencies").
const DepsDir = "/opt/relay/deps"

// Deps is an app's dependency manifest as loaded with its template: the
// bytes the runner installs from, so that what it builds is what was
// validated.
type Deps struct {
	// Manifest and Lockfile are the file names in the app directory
	// (PythonManifest; NodeManifest and NodeLockfile); Lockfile is "" for
	// python3.
	Manifest, Lockfile string
	// ManifestData and LockfileData are their contents.
	ManifestData, LockfileData []byte
}

// Digest returns the hex SHA-256 of the manifest's and lockfile's names
// and contents: equal digests install the same dependencies from the same
// runtime image. Nil d has the digest "".
func (d *Deps) Digest() string {
	if d == nil {
		return ""
	}
	h := sha256.New()
	for _, part := range []string{d.Manifest, string(d.ManifestData), d.Lockfile, string(d.LockfileData)} {
		fmt.Fprintf(h, "%d:%s;", len(part), part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// SecretsMountDir is where an app's secrets are mounted in its containers,
// one file per secret (docs/apps.md "Secrets"): the Docker and Kubernetes
// convention.
const SecretsMountDir = "/run/secrets"

// DefaultSecretsDir is the directory secrets are read from when
// RELAY_SECRETS_DIR is not set (docs/apps.md "Secrets").
const DefaultSecretsDir = "/var/lib/relay/secrets"

// MaxSecretNameBytes bounds a secret's name, a file name.
const MaxSecretNameBytes = 255

// CheckSecretName returns nil when name can name a secret: a plain file
// name of at most MaxSecretNameBytes made of letters, digits, '.', '_' and
// '-', not starting with '.'. The error says what is wrong with it.
func CheckSecretName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("secret name must not be empty")
	case len(name) > MaxSecretNameBytes:
		return fmt.Errorf("secret name of %d bytes; at most %d", len(name), MaxSecretNameBytes)
	case strings.HasPrefix(name, "."):
		return fmt.Errorf("secret name %q must not start with '.'", name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("secret name %q contains %q: a secret is a file name made of letters, digits, '.', '_' and '-'", name, c)
		}
	}
	return nil
}
