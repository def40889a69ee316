package netfault_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/netfault"
	"github.com/relaydev/relay/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// echo starts a line echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func proxyTo(t *testing.T, upstream string) *netfault.Proxy {
	t.Helper()
	p, err := netfault.Start(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string, within time.Duration) (string, error) {
	t.Helper()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(within))
	got, err := r.ReadString('\n')
	if len(got) > 0 {
		got = got[:len(got)-1]
	}
	return got, err
}

func TestBlackholeHoldsThenDeliversInOrder(t *testing.T) {
	p := proxyTo(t, echo(t))
	c, r := dial(t, p.Addr())
	if got, err := roundTrip(t, c, r, "one", 5*time.Second); err != nil || got != "one" {
		t.Fatalf("before the fault: %q, %v", got, err)
	}
	p.Blackhole()
	if got, err := roundTrip(t, c, r, "two", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("during the black hole: read %q, %v; want a timeout", got, err)
	}
	if _, err := c.Write([]byte("three\n")); err != nil {
		t.Fatal(err)
	}
	p.Heal()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for _, want := range []string{"two", "three"} {
		got, err := r.ReadString('\n')
		if err != nil || got != want+"\n" {
			t.Fatalf("after healing: %q, %v; want %q", got, err, want)
		}
	}
	if accepted, resets := p.Counts(); accepted != 1 || resets != 0 {
		t.Errorf("counts %d accepted, %d reset; want 1 and 0", accepted, resets)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestLatencyDelaysEachWay(t *testing.T) {
	p := proxyTo(t, echo(t))
	c, r := dial(t, p.Addr())
	p.SetLatency(150*time.Millisecond, 50*time.Millisecond)
	start := time.Now()
	for _, line := range []string{"a", "b", "c"} {
		if got, err := roundTrip(t, c, r, line, 5*time.Second); err != nil || got != line {
			t.Fatalf("%q, %v; want %q", got, err, line)
		}
	}
	// Each round trip crosses the proxy twice.
	if took := time.Since(start); took < 3*2*150*time.Millisecond {
		t.Errorf("3 round trips took %v with 150ms each way", took)
	}
}

func TestResetAllAndRefuse(t *testing.T) {
	p := proxyTo(t, echo(t))
	c, r := dial(t, p.Addr())
	if _, err := roundTrip(t, c, r, "x", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := p.ResetAll(); n != 1 {
		t.Fatalf("reset %d connections, want 1", n)
	}
	if _, err := roundTrip(t, c, r, "y", 5*time.Second); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Errorf("read after a reset: %v, want ECONNRESET", err)
	}
	p.Refuse(true)
	// The reset may reach the client during its connect or after it.
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		if _, err := roundTrip(t, c2, bufio.NewReader(c2), "z", 5*time.Second); err == nil {
			t.Error("a refused connection answered")
		}
		c2.Close()
	}
	p.Refuse(false)
	c3, r3 := dial(t, p.Addr())
	if got, err := roundTrip(t, c3, r3, "back", 5*time.Second); err != nil || got != "back" {
		t.Errorf("after refusing: %q, %v", got, err)
	}
}

// TestRedisThroughABlackhole: a rueidis client's command times out while
// the path is black-holed and the same client works again once it heals.
func TestRedisThroughABlackhole(t *testing.T) {
	p := proxyTo(t, redistest.Addr(t))
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{p.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ping := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return c.Do(ctx, c.B().Ping().Build()).Error()
	}
	if err := ping(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	if err := ping(300 * time.Millisecond); err == nil {
		t.Fatal("PING answered through a black hole")
	}
	p.Heal()
	deadline := time.Now().Add(20 * time.Second)
	for ping(2*time.Second) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the client did not recover within 20 s of the heal")
		}
	}
}
