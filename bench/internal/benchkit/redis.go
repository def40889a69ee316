package benchkit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/rueidis"
)

// Redis is a private redis-server process started by StartRedis.
type Redis struct {
	// Addr is host:port of the server.
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
	dir  string
}

// StartRedis runs redis-server on a free port of 127.0.0.1 with its files
// in dir, persistence off (no RDB, no AOF: the benchmarks measure Relay, not
// the disk), and waits until it answers PING, at most 10 s. The server dies
// with this process (Pdeathsig), so an interrupted benchmark leaves none
// behind; Stop ends it earlier.
func StartRedis(dir string) (*Redis, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server not found in PATH (apt-get install redis-server, or pass -redis host:port): %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("find a free port for redis-server: %w", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--logfile", filepath.Join(dir, "redis.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	r := &Redis{Addr: addr, cmd: cmd, done: make(chan struct{}), dir: dir}
	go func() { _ = cmd.Wait(); close(r.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := Connect(addr)
		if err == nil {
			c.Close()
			return r, nil
		}
		if time.Now().After(deadline) {
			r.Stop()
			return nil, fmt.Errorf("redis-server on %s did not answer PING within 10s (log: %s)", addr, filepath.Join(dir, "redis.log"))
		}
		select {
		case <-r.done:
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			return nil, fmt.Errorf("redis-server exited at start: %s", log)
		case <-time.After(20 * time.Millisecond): // poll interval
		}
	}
}

// PID returns the server's process id.
func (r *Redis) PID() int { return r.cmd.Process.Pid }

// Stop ends the server (SIGTERM, SIGKILL after 10 s) and waits for it.
func (r *Redis) Stop() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// Connect returns a client of addr as relay start builds one (no
// client-side cache), after checking that the server answers PING.
func Connect(addr string) (rueidis.Client, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return nil, fmt.Errorf("connect to redis %s: %w", addr, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
		c.Close()
		return nil, fmt.Errorf("ping redis %s: %w", addr, err)
	}
	return c, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	a, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("listener address is not TCP")
	}
	return a.Port, nil
}

// OpenRedis connects to the server at addr, or, when addr is empty, to one
// started with StartRedis in dir. It returns the address, a client, and a
// close that closes the client and stops a server it started.
func OpenRedis(addr, dir string) (string, rueidis.Client, func(), error) {
	stop := func() {}
	if addr == "" {
		srv, err := StartRedis(dir)
		if err != nil {
			return "", nil, nil, err
		}
		addr, stop = srv.Addr, srv.Stop
	}
	c, err := Connect(addr)
	if err != nil {
		stop()
		return "", nil, nil, err
	}
	return addr, c, func() { c.Close(); stop() }, nil
}
