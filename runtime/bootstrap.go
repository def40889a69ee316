package runtime

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"path"
)

// Names of the language runtimes Relay bootstraps (template.yaml `runtime`).
const (
	RuntimePython3 = "python3"
	RuntimeNode    = "node"
	// RuntimeGo names an app whose handlers are Go functions registered
	// with a Func in the worker's process: it has no bootstrap, and no
	// container runs it (docs/apps.md#go-handlers).
	RuntimeGo = "go"
)

// BootstrapDir is the directory in a container where a runner mounts the
// bootstrap script, read-only (docs/apps.md "The handler contract").
const BootstrapDir = "/relay"

// Exit codes of the bootstraps besides 0 (success); docs/runtimes.md.
const (
	// ExitHandlerFailed: the handler raised or threw (also while its module
	// was loading); the traceback or stack is on stderr.
	ExitHandlerFailed = 1
	// ExitBootstrapUsage: RELAY_HANDLER is missing or not module.function,
	// or stdin is not JSON.
	ExitBootstrapUsage = 2
	// ExitHandlerNotFound: the handler's module or function does not exist,
	// the code a shell gives for a command that is not found.
	ExitHandlerNotFound = 127
)

var (
	//go:embed bootstrap/python3.py
	python3Bootstrap []byte
	//go:embed bootstrap/node.cjs
	nodeBootstrap []byte
)

// Bootstrap is the script Relay embeds for one language runtime: it imports
// the handler's module from the working directory (/app in a container),
// calls the function with the event read from stdin and turns the outcome
// into an exit code (docs/apps.md "The handler contract"; docs/runtimes.md).
type Bootstrap struct {
	// Runtime is RuntimePython3 or RuntimeNode.
	Runtime string
	// FileName is the script's base name, such as "bootstrap.py".
	FileName string
	// Source is the script; callers must not modify it.
	Source []byte

	interpreter []string // command before the script's path
	inlineFlag  string   // interpreter flag that takes the script as text
}

// LookupBootstrap returns the bootstrap of runtime ("python3" or "node").
// An unknown runtime is an error wrapping ErrUnavailable.
func LookupBootstrap(runtime string) (Bootstrap, error) {
	switch runtime {
	case RuntimePython3:
		// -u: output reaches the log as it is written, not when a buffer
		// fills, so a handler killed at its timeout still shows its lines.
		// -B: /app is read-only, there is nowhere to write bytecode.
		return Bootstrap{Runtime: runtime, FileName: "bootstrap.py", Source: python3Bootstrap,
			interpreter: []string{"python3", "-u", "-B"}, inlineFlag: "-c"}, nil
	case RuntimeNode:
		// .cjs: CommonJS whatever package.json is found above the mount.
		return Bootstrap{Runtime: runtime, FileName: "bootstrap.cjs", Source: nodeBootstrap,
			interpreter: []string{"node"}, inlineFlag: "-e"}, nil
	}
	if runtime == RuntimeGo {
		return Bootstrap{}, fmt.Errorf("runtime go: the handlers are Go functions, which only a runtime.Func in the worker's process runs, not containers (docs/apps.md#go-handlers): %w", ErrUnavailable)
	}
	return Bootstrap{}, fmt.Errorf("unknown runtime %q (want %q or %q): %w", runtime, RuntimePython3, RuntimeNode, ErrUnavailable)
}

// Digest returns the hex SHA-256 of Source, which names a copy of the script
// on disk so that copies of different Relay versions never collide.
func (b Bootstrap) Digest() string {
	sum := sha256.Sum256(b.Source)
	return hex.EncodeToString(sum[:])
}

// MountPath returns where a runner mounts the script in a container:
// BootstrapDir/FileName.
func (b Bootstrap) MountPath() string { return path.Join(BootstrapDir, b.FileName) }

// Command returns the command line that runs the script stored at
// scriptPath (as seen by the handler process).
func (b Bootstrap) Command(scriptPath string) []string {
	return append(append([]string(nil), b.interpreter...), scriptPath)
}

// InlineCommand returns a command line that passes the script as an
// argument (python3 -c, node -e), for runners that cannot place a file where
// the handler sees it. It behaves like Command except that tracebacks name
// the script "<string>" or "[eval]".
func (b Bootstrap) InlineCommand() []string {
	return append(append([]string(nil), b.interpreter...), b.inlineFlag, string(b.Source))
}

// BootstrapCommand returns the inline command line of runtime's bootstrap
// (Bootstrap.InlineCommand). An unknown runtime is an error wrapping
// ErrUnavailable.
func BootstrapCommand(runtime string) ([]string, error) {
	b, err := LookupBootstrap(runtime)
	if err != nil {
		return nil, err
	}
	return b.InlineCommand(), nil
}

// Command returns the command line of spec's handlers for runners without a
// mount (Process): the inline bootstrap when spec.Runtime is set,
// spec.Command otherwise. It returns nil and no error when neither is set
// (the image's entrypoint runs). The containerd runner mounts the bootstrap
// as a file instead (Bootstrap.Command).
func Command(spec Spec) ([]string, error) {
	if spec.Runtime != "" {
		return BootstrapCommand(spec.Runtime)
	}
	return spec.Command, nil
}
