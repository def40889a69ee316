package shimproc

import (
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if os.Getenv("SHIMPROC_FAKE") == "1" {
		time.Sleep(time.Minute) // a shim as /proc shows it
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestListFindsAShimByItsCommandLine runs this test binary under a shim's
// name and arguments and expects List to report it with its fields, and
// no other process of this test.
func TestListFindsAShimByItsCommandLine(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := &exec.Cmd{
		Path: self,
		Args: []string{"/usr/bin/containerd-shim-runc-v2", "-namespace", "ns1", "-id", "app.handler-00ff", "-address", "/run/x/containerd.sock"},
		Env:  append(os.Environ(), "SHIMPROC_FAKE=1"),
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	want := Shim{PID: cmd.Process.Pid, Namespace: "ns1", ID: "app.handler-00ff", Address: "/run/x/containerd.sock"}
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Contains(List(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("List() = %+v, want it to hold %+v", List(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if slices.ContainsFunc(List(), func(s Shim) bool { return s.PID == os.Getpid() }) {
		t.Error("List reports the test itself, which is no shim")
	}
}
