// Package redistest runs private redis-server processes for tests.
//
// One shared server per test binary is started on first use and stopped by
// Main; tests get unique key names from Name, so they never flush the
// database and may run in parallel. Tests that restart or kill Redis start a
// server of their own with Start. RELAY_TEST_REDIS_URL points the shared
// client at an existing server instead. When redis-server is missing the test
// is skipped, unless RELAY_TEST_REQUIRE=1 makes it fail.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

var (
	sharedOnce sync.Once
	shared     *Server
	sharedAddr string
	sharedErr  error
)

// Main runs the tests and stops the shared server afterwards. Call it from
// TestMain: func TestMain(m *testing.M) { redistest.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.stop()
	}
	os.Exit(code)
}

// Addr returns host:port of the shared server, starting it on first use.
func Addr(t testing.TB) string {
	t.Helper()
	sharedOnce.Do(func() {
		if u := os.Getenv("RELAY_TEST_REDIS_URL"); u != "" {
			sharedAddr = strings.TrimPrefix(u, "redis://")
			return
		}
		dir, err := os.MkdirTemp("", "redistest-")
		if err != nil {
			sharedErr = err
			return
		}
		shared, sharedErr = start(dir, Options{})
		if sharedErr == nil {
			sharedAddr = shared.Addr
		}
	})
	if sharedErr != nil {
		unavailable(t, sharedErr)
	}
	return sharedAddr
}

// Client returns a new client of the shared server, closed at test cleanup.
func Client(t testing.TB) rueidis.Client {
	t.Helper()
	return Connect(t, Addr(t))
}

// Connect returns a client of addr, closed at test cleanup.
func Connect(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatalf("redistest: connect %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// Name returns a name unique to this test run, built from the test name and
// parts, safe to use as a stream, group or key name.
func Name(t testing.TB, parts ...string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	s := unsafeChars.ReplaceAllString(t.Name(), "_")
	if len(s) > 40 {
		s = s[len(s)-40:]
	}
	for _, p := range parts {
		s += "." + p
	}
	return s + "." + hex.EncodeToString(b)
}

// Options configure a private server.
type Options struct {
	// AppendOnly turns on AOF so data survives Restart.
	AppendOnly bool
}

// Server is a private redis-server process.
type Server struct {
	Addr string
	dir  string
	port int
	opts Options
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs a private server for one test and stops it at cleanup.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := start(t.TempDir(), opts)
	if err != nil {
		unavailable(t, err)
	}
	t.Cleanup(s.stop)
	return s
}

func start(dir string, opts Options) (*Server, error) {
	_, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found in PATH (apt-get install redis-server): %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, port: port, opts: opts}
	if err := s.run(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) run() error {
	aof := "no"
	if s.opts.AppendOnly {
		aof = "yes"
	}
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--dir", s.dir, "--save", "", "--appendonly", aof, "--appendfsync", "always",
		"--daemonize", "no", "--logfile", filepath.Join(s.dir, "redis.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ping(s.Addr) == nil {
			return nil
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server exited at start: %s", log)
		case <-time.After(20 * time.Millisecond):
		}
	}
	_ = cmd.Process.Kill()
	return fmt.Errorf("redis-server on %s did not answer PING within 10s", s.Addr)
}

func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 7)
	n, err := conn.Read(buf)
	if err != nil {
		return err
	}
	if string(buf[:n]) != "+PONG\r\n" {
		return fmt.Errorf("unexpected PING reply %q", buf[:n])
	}
	return nil
}

// Kill stops the server with SIGKILL and waits for it to exit.
func (s *Server) Kill() { s.signal(syscall.SIGKILL) }

// Stop stops the server with SIGTERM (AOF is flushed) and waits.
func (s *Server) Stop() { s.signal(syscall.SIGTERM) }

// Pause freezes the server with SIGSTOP: its connections stay open and
// nothing answers, as with a hung host. It returns once the server has
// stopped (testutil.WaitStopped), or after 30s. Resume continues it.
func (s *Server) Pause() {
	s.send(syscall.SIGSTOP)
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	testutil.WaitStopped(cmd.Process.Pid, 30*time.Second)
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.send(syscall.SIGCONT) }

func (s *Server) send(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Restart starts the server again on the same port and directory.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.TryRestart(); err != nil {
		t.Fatalf("redistest: restart: %v", err)
	}
}

// TryRestart is Restart for a goroutine other than the test's, which must
// not call t.Fatal: it tries for up to 10 s, since another process may
// hold the port for a moment after the server left it, and returns the
// last error.
func (s *Server) TryRestart() error {
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err = s.run(); err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func (s *Server) stop() {
	s.Kill()
	if s == shared {
		_ = os.RemoveAll(s.dir)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func unavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("RELAY_TEST_REQUIRE") == "1" {
		t.Fatalf("redistest: %v (RELAY_TEST_REQUIRE=1)", err)
	}
	t.Skipf("redistest: %v", err)
}

// Ctx returns a context for cleanup code, which runs after t.Context is
// cancelled.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Settled reports whether group has delivered everything up to last on
// streamName and nothing is pending: every message was acknowledged.
func Settled(ctx context.Context, rc rueidis.Client, streamName, group, last string) bool {
	n, _, err := redisstream.New(rc, streamName, group, "checker").Pending(ctx)
	if err != nil || n != 0 {
		return false
	}
	info, err := rc.Do(ctx, rc.B().XinfoGroups().Key(streamName).Build()).ToArray()
	if err != nil {
		return false
	}
	for _, g := range info {
		m, err := g.AsMap()
		if err != nil {
			return false
		}
		name, lastDelivered := m["name"], m["last-delivered-id"]
		if n, _ := name.ToString(); n != group {
			continue
		}
		l, _ := lastDelivered.ToString()
		return stream.CompareID(l, last) >= 0
	}
	return false
}
