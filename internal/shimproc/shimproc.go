// Package shimproc finds the containerd shim processes running on this
// host by their command lines, without asking containerd or the shims: a
// shim may not serve requests yet, and containerd may have forgotten it
// (docs/operations.md "containerd").
package shimproc

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Shim is a shim process, as its command line
// ("containerd-shim-runc-v2 -namespace <ns> -id <id> -address <addr>")
// names it.
type Shim struct {
	PID       int
	Namespace string
	ID        string // the container it was started for
	Address   string // the socket of the containerd that started it
}

// List returns the shim processes visible in /proc: none when /proc shows
// none, as in a PID namespace of its own.
func List() []Shim {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []Shim
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		sh := Shim{PID: pid}
		for i := 1; i+1 < len(args); i++ {
			switch args[i] {
			case "-namespace":
				sh.Namespace = args[i+1]
			case "-id":
				sh.ID = args[i+1]
			case "-address":
				sh.Address = args[i+1]
			}
		}
		out = append(out, sh)
	}
	return out
}
