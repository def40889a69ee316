package topology

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// pids reads the pid files the script wrote under dir/<kind>/<port>.
func pids(t *testing.T, dir, kind string) []int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, kind, "*", "redis.pid"))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, pid)
	}
	return out
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestClusterScript: start forms a working 3-master cluster, a second start
// reuses it, and stop ends exactly the recorded processes.
func TestClusterScript(t *testing.T) {
	require(t)
	ctx := context.Background()
	dir := t.TempDir()
	c, err := StartCluster(ctx, dir)
	if err != nil {
		unavailable(t, err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	if len(c.Seeds) != 3 {
		t.Fatalf("seeds %v, want 3", c.Seeds)
	}
	rc, err := rueidis.NewClient(c.ClientOption())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if rc.Mode() != rueidis.ClientModeCluster || len(rc.Nodes()) != 3 {
		t.Fatalf("mode %s with %d nodes, want a cluster of 3", rc.Mode(), len(rc.Nodes()))
	}
	if err := rc.Do(ctx, rc.B().Set().Key("k").Value("v").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	before := pids(t, dir, "cluster")
	if len(before) != 3 {
		t.Fatalf("pid files %v, want 3", before)
	}

	again := &Cluster{dir: dir, base: c.base}
	out, err := again.script(ctx, "start")
	if err != nil {
		t.Fatal(err)
	}
	if got := lastLine(out); got != strings.Join(c.Seeds, ",") {
		t.Errorf("second start printed %q, want %q", got, strings.Join(c.Seeds, ","))
	}
	if after := pids(t, dir, "cluster"); !equalInts(before, after) {
		t.Errorf("second start changed the processes: %v -> %v", before, after)
	}
	if v, err := rc.Do(ctx, rc.B().Get().Key("k").Build()).ToString(); err != nil || v != "v" {
		t.Errorf("data lost by the second start: %q, %v", v, err)
	}

	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for _, pid := range before {
		if alive(pid) {
			t.Errorf("pid %d still running after stop", pid)
		}
	}
	if left := pids(t, dir, "cluster"); len(left) != 0 {
		t.Errorf("pid files left: %v", left)
	}
}

// TestSentinelScript: kill-master kills the master, the sentinels promote
// the replica, start brings the old master back as a replica, and stop
// ends every recorded process.
func TestSentinelScript(t *testing.T) {
	require(t)
	ctx := context.Background()
	dir := t.TempDir()
	s, err := StartSentinel(ctx, dir, SentinelOptions{DownAfter: time.Second})
	if err != nil {
		unavailable(t, err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	first, err := s.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	killed, err := s.KillMaster(ctx)
	if err != nil || killed != first {
		t.Fatalf("KillMaster = %s, %v; want %s", killed, err, first)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := s.Master(ctx)
		if err == nil && m != first {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failover within 30s (master %s, %v)", m, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	old, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{first}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	// The old master comes back as a master, as its config says, until a
	// sentinel sees it again and turns it into a replica of the new one.
	var role string
	deadline = time.Now().Add(30 * time.Second)
	for role != "slave" && time.Now().Before(deadline) {
		if reply, err := old.Do(ctx, old.B().Role().Build()).ToArray(); err == nil && len(reply) > 0 {
			role, _ = reply[0].ToString()
		}
		time.Sleep(100 * time.Millisecond)
	}
	old.Close()
	if role != "slave" {
		t.Errorf("old master restarted as %q 30s later, want a replica", role)
	}

	all := pids(t, dir, "sentinel")
	if len(all) != 5 {
		t.Fatalf("pid files %v, want 5", all)
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for _, pid := range all {
		if alive(pid) {
			t.Errorf("pid %d still running after stop", pid)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
