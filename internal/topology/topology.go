// Package topology starts the multi-process Redis topologies of Relay's
// cluster and failover tests and benchmarks — a 3-master Redis Cluster and
// a master + replica + 3 sentinels — through the project's own scripts,
// scripts/cluster.sh and scripts/sentinel.sh, so tests exercise exactly
// what an operator runs. Each topology lives in its own state directory on
// free loopback ports and is stopped by the script, which ends only the PIDs
// it recorded.
//
// The testing helpers (NewCluster, NewSentinel) skip the test when
// redis-server is missing or with -short, unless RELAY_TEST_REQUIRE=1 makes
// it fail. They are safe to call from parallel tests.
package topology

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// DefaultMasterSet is the Sentinel master set of scripts/sentinel.sh.
const DefaultMasterSet = "relay"

// Cluster is a running 3-master Redis Cluster started by scripts/cluster.sh.
type Cluster struct {
	// Seeds are the three nodes' host:port addresses.
	Seeds []string
	dir   string
	base  int
}

// StartCluster starts a cluster under dir on free ports. Stop it with Stop.
func StartCluster(ctx context.Context, dir string) (*Cluster, error) {
	var lastErr error
	// A port found free can be taken before redis-server binds it: retry
	// on other ports a few times.
	for range 4 {
		base, err := freeBase(3, 10000)
		if err != nil {
			return nil, err
		}
		c := &Cluster{dir: dir, base: base}
		out, err := c.script(ctx, "start")
		if err == nil {
			c.Seeds = strings.Split(lastLine(out), ",")
			return c, nil
		}
		lastErr = err
		_ = c.Stop(context.WithoutCancel(ctx))
	}
	return nil, lastErr
}

// Stop stops every node the script started.
func (c *Cluster) Stop(ctx context.Context) error {
	_, err := c.script(ctx, "stop")
	return err
}

func (c *Cluster) script(ctx context.Context, cmd string) (string, error) {
	return runScript(ctx, "cluster.sh", nil, cmd, c.dir, strconv.Itoa(c.base))
}

// ClientOption returns rueidis options for a cluster client of c.
func (c *Cluster) ClientOption() rueidis.ClientOption {
	return rueidis.ClientOption{InitAddress: c.Seeds, DisableCache: true}
}

// SentinelOptions configure NewSentinel and StartSentinel.
type SentinelOptions struct {
	// DownAfter is how long the master must be unreachable before the
	// sentinels declare it down. Default: 1s.
	DownAfter time.Duration
}

// Sentinel is a running master + replica + 3 sentinels started by
// scripts/sentinel.sh.
type Sentinel struct {
	// Sentinels are the three sentinels' host:port addresses.
	Sentinels []string
	// MasterSet is the name the sentinels monitor the master under.
	MasterSet string
	dir       string
	base      int
	env       []string
}

// StartSentinel starts the topology under dir on free ports. Stop it
// with Stop.
func StartSentinel(ctx context.Context, dir string, opts SentinelOptions) (*Sentinel, error) {
	if opts.DownAfter <= 0 {
		opts.DownAfter = time.Second
	}
	env := []string{
		"SENTINEL_MASTER=" + DefaultMasterSet,
		"SENTINEL_DOWN_AFTER_MS=" + strconv.FormatInt(opts.DownAfter.Milliseconds(), 10),
	}
	var lastErr error
	for range 4 {
		base, err := freeBase(5, 0)
		if err != nil {
			return nil, err
		}
		s := &Sentinel{MasterSet: DefaultMasterSet, dir: dir, base: base, env: env}
		out, err := s.script(ctx, "start")
		if err == nil {
			s.Sentinels = strings.Split(lastLine(out), ",")
			return s, nil
		}
		lastErr = err
		_ = s.Stop(context.WithoutCancel(ctx))
	}
	return nil, lastErr
}

// KillMaster SIGKILLs the node that the sentinels currently report as
// master and returns its address.
func (s *Sentinel) KillMaster(ctx context.Context) (string, error) {
	out, err := s.script(ctx, "kill-master")
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", lastLine(out)), nil
}

// Restart starts again every process of the topology that is down, such
// as a master killed by KillMaster, which rejoins as a replica of the
// promoted one once the sentinels see it, and waits until the replica is
// in sync again.
func (s *Sentinel) Restart(ctx context.Context) error {
	_, err := s.script(ctx, "start")
	return err
}

// Master returns the address the sentinels currently report as master.
func (s *Sentinel) Master(ctx context.Context) (string, error) {
	var errs []error
	for _, addr := range s.Sentinels {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		hp, err := c.Do(ctx, c.B().Arbitrary("SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterSet).Build()).AsStrSlice()
		c.Close()
		if err == nil && len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
		errs = append(errs, fmt.Errorf("sentinel %s: %v", addr, err))
	}
	return "", fmt.Errorf("no sentinel names the master of %s: %w", s.MasterSet, errors.Join(errs...))
}

// Stop stops every process the script started.
func (s *Sentinel) Stop(ctx context.Context) error {
	_, err := s.script(ctx, "stop")
	return err
}

func (s *Sentinel) script(ctx context.Context, cmd string) (string, error) {
	return runScript(ctx, "sentinel.sh", s.env, cmd, s.dir, strconv.Itoa(s.base))
}

// ClientOption returns rueidis options for a Sentinel client of s's
// master, refreshing the topology every second.
func (s *Sentinel) ClientOption() rueidis.ClientOption {
	return rueidis.ClientOption{
		InitAddress: s.Sentinels, DisableCache: true,
		Sentinel: rueidis.SentinelOption{MasterSet: s.MasterSet, TopologyRefreshInterval: time.Second},
	}
}

// NewCluster starts a cluster for t and stops it at cleanup.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	require(t)
	c, err := StartCluster(t.Context(), t.TempDir())
	if err != nil {
		unavailable(t, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("topology: stop cluster: %v", err)
		}
	})
	return c
}

// NewSentinel starts a Sentinel topology for t and stops it at cleanup.
func NewSentinel(t testing.TB, opts SentinelOptions) *Sentinel {
	t.Helper()
	require(t)
	s, err := StartSentinel(t.Context(), t.TempDir(), opts)
	if err != nil {
		unavailable(t, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("topology: stop sentinel: %v", err)
		}
	})
	return s
}

// Connect returns a client built from opt, closed at test cleanup.
func Connect(t testing.TB, opt rueidis.ClientOption) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("topology: connect %v: %v", opt.InitAddress, err)
	}
	t.Cleanup(c.Close)
	return c
}

// require skips (or fails) a test that cannot have a topology.
func require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("topology: multi-process Redis topologies are skipped with -short")
	}
	for _, bin := range []string{"redis-server", "redis-cli", "bash"} {
		if _, err := exec.LookPath(bin); err != nil {
			unavailable(t, fmt.Errorf("%s not found in PATH (apt-get install redis-server redis-tools)", bin))
		}
	}
}

func unavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("RELAY_TEST_REQUIRE") == "1" {
		t.Fatalf("topology: %v (RELAY_TEST_REQUIRE=1)", err)
	}
	t.Skipf("topology: %v", err)
}

// scriptsDir is the repository's scripts directory, found from this
// source file so tests and tools work from any working directory.
func scriptsDir() (string, error) {
	_, file, _, ok := goruntime.Caller(0)
	if !ok {
		return "", errors.New("topology: cannot locate the scripts directory")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "scripts"), nil
}

func runScript(ctx context.Context, name string, env []string, args ...string) (string, error) {
	dir, err := scriptsDir()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(dir, name)}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("scripts/%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// freeBase returns a port p such that p..p+n-1 (and, when busOffset > 0,
// the same ports plus busOffset) are free now. Ports come from below the
// kernel's usual ephemeral range (32768+), so outgoing connections do not
// take them between this check and the servers' start.
func freeBase(n, busOffset int) (int, error) {
	const lo, hi = 15000, 22000 // with a bus offset of 10000, bus ports stay below 32768
	for range 200 {
		base := lo + rand.IntN(hi-lo-n)
		if portsFree(base, n) && (busOffset == 0 || portsFree(base+busOffset, n)) {
			return base, nil
		}
	}
	return 0, errors.New("topology: no run of free loopback ports found")
}

func portsFree(base, n int) bool {
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}
