package containerd

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/relaydev/relay/runtime/containerd/internal/deps"
	"github.com/relaydev/relay/runtime/containerd/internal/secrets"
)

// Defaults of dependency builds (docs/runtimes.md "Dependencies").
const (
	// DefaultMaxConcurrentBuilds bounds the dependency builds one Runner
	// runs at a time (MAX_CONCURRENT_BUILDS).
	DefaultMaxConcurrentBuilds = 2
	// DefaultBuildTimeout bounds one dependency build.
	DefaultBuildTimeout = 15 * time.Minute
	// DefaultBuildRetryInterval is how long a failed build of a manifest is
	// not tried again: invocations of the app fail at once with its error
	// meanwhile. A changed manifest builds at once.
	DefaultBuildRetryInterval = 5 * time.Minute
	// BuildMemoryBytes (2 GiB) and BuildPIDs (1024) limit a build
	// container.
	BuildMemoryBytes = deps.BuildMemoryBytes
	BuildPIDs        = deps.BuildPIDs
	// DefaultDepsRetention is how long a dependency image no Runner uses
	// stays in containerd (WithDepsRetention).
	DefaultDepsRetention = 7 * 24 * time.Hour
	// DepsImagePrefix ("relay.local/deps:") names dependency images:
	// DepsImagePrefix + the cache key (64 hex digits).
	DepsImagePrefix = deps.ImagePrefix
)

// BuildEnvNames are the variables of the worker's environment passed to
// dependency builds, so that private package indexes and registries work
// (docs/runtimes.md "Dependencies").
var BuildEnvNames = []string{"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "npm_config_registry",
	"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"}

// MaxSecretBytes (1 MiB) bounds one secret file (the size of a Kubernetes
// Secret).
const MaxSecretBytes = secrets.MaxBytes

// WithSecretsDir sets the directory whose files an app's `secrets` name
// (RELAY_SECRETS_DIR; docs/apps.md "Secrets"). Default:
// runtime.DefaultSecretsDir.
func WithSecretsDir(dir string) Option {
	return func(o *options) error {
		if dir == "" {
			return errors.New("containerd: WithSecretsDir: empty directory")
		}
		o.secretsDir = dir
		return nil
	}
}

// WithMaxConcurrentBuilds bounds the dependency builds that run at a time;
// further ones wait. n must be > 0. Default: DefaultMaxConcurrentBuilds.
func WithMaxConcurrentBuilds(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return errors.New("containerd: WithMaxConcurrentBuilds: must be > 0")
		}
		o.maxBuilds = n
		return nil
	}
}

// WithDepsRetention sets how long a dependency image stays in containerd
// after the last use by any Runner of the namespace: Sweep removes older
// ones (docs/runtimes.md "Dependencies"), so that the images of changed
// manifests do not fill the disk. A Runner marks the images its apps use
// (LabelDepsUsed) at most once per hour; d should be longer than the
// longest time an app may go without a Run. 0 keeps them until removed by
// hand. d must be 0 or at least an hour. Default: DefaultDepsRetention.
func WithDepsRetention(d time.Duration) Option {
	return func(o *options) error {
		if d != 0 && d < time.Hour {
			return errors.New("containerd: WithDepsRetention: must be 0 or at least 1h")
		}
		o.depsRetention = d
		return nil
	}
}

// WithBuildTimeout bounds one dependency build. d must be > 0.
// Default: DefaultBuildTimeout.
func WithBuildTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return errors.New("containerd: WithBuildTimeout: must be > 0")
		}
		o.buildTimeout = d
		return nil
	}
}

// WithBuildEnv sets the variables given to dependency builds, such as
// PIP_INDEX_URL or npm_config_registry; names outside BuildEnvNames are
// refused. Default: those of BuildEnvNames set in the worker's
// environment.
func WithBuildEnv(env map[string]string) Option {
	return func(o *options) error {
		o.buildEnv = map[string]string{}
		for k, v := range env {
			ok := false
			for _, n := range BuildEnvNames {
				ok = ok || n == k
			}
			if !ok {
				return fmt.Errorf("containerd: WithBuildEnv: %s is not one of %v", k, BuildEnvNames)
			}
			o.buildEnv[k] = v
		}
		return nil
	}
}

// WithBuildCAFile adds the PEM certificates in file to those dependency
// builds trust, for a package mirror with a private CA
// (RELAY_BUILD_CA_FILE). The file must exist.
func WithBuildCAFile(file string) Option {
	return func(o *options) error {
		if _, err := os.Stat(file); err != nil {
			return fmt.Errorf("containerd: WithBuildCAFile: %w", err)
		}
		o.buildCAFile = file
		return nil
	}
}

// buildEnvFromOS returns the variables of BuildEnvNames set in the
// process's environment.
func buildEnvFromOS() map[string]string {
	env := map[string]string{}
	for _, n := range BuildEnvNames {
		if v, ok := os.LookupEnv(n); ok {
			env[n] = v
		}
	}
	return env
}
