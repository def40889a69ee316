package runtime

import (
	_ "embed"
	"fmt"
)

// Names of the language runtimes Relay bootstraps (template.yaml `runtime`).
const (
	RuntimePython3 = "python3"
	RuntimeNode    = "node"
)

var (
	//go:embed bootstrap/python3.py
	python3Bootstrap string
	//go:embed bootstrap/node.js
	nodeBootstrap string
)

// BootstrapCommand returns the command line that runs a handler of the given
// language runtime: the interpreter with Relay's embedded bootstrap inline,
// which imports the handler's module from the working directory (/app in a
// container) and calls its function with the event read from stdin.
//
// TODO: DESIGN.md has the bootstrap mounted read-only as a file; passing it
// inline is equivalent for these few lines and needs no host file.
func BootstrapCommand(runtime string) ([]string, error) {
	switch runtime {
	case RuntimePython3:
		return []string{"python3", "-c", python3Bootstrap}, nil
	case RuntimeNode:
		return []string{"node", "-e", nodeBootstrap}, nil
	}
	return nil, fmt.Errorf("unknown runtime %q: %w", runtime, ErrUnavailable)
}

// Command returns the command line of spec's handlers: the bootstrap when
// spec.Runtime is set, spec.Command otherwise. It returns nil and no error
// when neither is set (the image's entrypoint runs).
func Command(spec Spec) ([]string, error) {
	if spec.Runtime != "" {
		return BootstrapCommand(spec.Runtime)
	}
	return spec.Command, nil
}
