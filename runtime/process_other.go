//go:build !unix

package runtime

import (
	"os"
	"os/exec"
)

func setProcessGroup(*exec.Cmd) {}

func killProcessGroup(cmd *exec.Cmd) error { return cmd.Process.Kill() }

func signalOf(*os.ProcessState) (int, bool) { return 0, false }
