// Package netfault is a TCP proxy for tests that puts network faults
// between a client and its server: latency with jitter, a black hole
// (nothing flows either way and nothing is closed, as when a route drops
// packets), connections reset mid-stream, and new connections refused.
//
// Unlike a proxy that drops bytes, a black hole here holds them: when it
// heals, what was sent during it is delivered in order, as TCP's
// retransmissions would. So a request written during a partition can
// still reach the server after it, which is the case a client that gave up
// waiting for the reply must survive.
package netfault

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Proxy forwards every connection to its listener to one upstream
// address. Its methods are safe for concurrent use.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	links   map[*link]struct{}
	open    chan struct{} // closed while traffic flows; a new one while black-holed
	holed   bool
	latency time.Duration
	jitter  time.Duration
	refuse  bool
	closed  bool
	wg      sync.WaitGroup

	accepted, resets int
}

// Start listens on a free loopback port and forwards to upstream
// (host:port).
func Start(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{ln: ln, upstream: upstream, links: map[*link]struct{}{}, open: open}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the host:port clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Blackhole stops traffic both ways on every connection, present and
// future, without closing any: reads on either side wait, and writes
// succeed until the socket buffers fill. New connections are accepted
// (the handshake completes) but carry nothing.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.holed {
		p.holed, p.open = true, make(chan struct{})
	}
}

// Heal ends a black hole: what was held is delivered, in order.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holed {
		p.holed = false
		close(p.open)
	}
}

// SetLatency delays every chunk of data, each way, by base plus a random
// part of jitter (order is kept). Zero values remove it.
func (p *Proxy) SetLatency(base, jitter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency, p.jitter = base, jitter
}

// Refuse makes the proxy reset new connections at once (as a host whose
// port is closed), or stops doing so.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = on
}

// ResetAll resets every open connection on both sides (TCP RST), and
// returns how many it reset.
func (p *Proxy) ResetAll() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.resets += len(links)
	p.mu.Unlock()
	for _, l := range links {
		l.reset()
	}
	return len(links)
}

// Counts returns the connections accepted and reset so far.
func (p *Proxy) Counts() (accepted, resets int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted, p.resets
}

// Close stops listening, resets every connection and waits for the
// proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Heal()
	p.ResetAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse, closed := p.refuse, p.closed
		p.accepted++
		p.mu.Unlock()
		if refuse || closed {
			rst(c)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve connects c to the upstream and forwards both ways until either
// side ends.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		rst(c)
		return
	}
	l := &link{client: c, server: up}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.reset()
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(up, c) }()
	go func() { defer wg.Done(); p.pipe(c, up) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	l.close()
}

// chunk is data read from one side and when it may be written to the
// other.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst through the faults: a reader stamps each chunk
// with its due time, a writer waits for it and for the black hole to end.
// A bounded queue between them makes a held direction push back on its
// sender as TCP flow control would.
func (p *Proxy) pipe(dst, src net.Conn) {
	queue := make(chan chunk, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range queue {
			if !p.wait(ch.due) {
				continue
			}
			if _, err := dst.Write(ch.data); err != nil {
				src.Close()
				for range queue {
				}
				return
			}
		}
		closeWrite(dst)
	}()
	var last time.Time
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			due := time.Now().Add(p.delay())
			if due.Before(last) {
				due = last // jitter never reorders
			}
			last = due
			queue <- chunk{data: buf[:n], due: due}
		}
		if err != nil {
			break
		}
	}
	close(queue)
	<-done
}

// wait sleeps until due and while black-holed; false when the proxy
// closed.
func (p *Proxy) wait(due time.Time) bool {
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
	for {
		p.mu.Lock()
		open, closed := p.open, p.closed
		p.mu.Unlock()
		if closed {
			return false
		}
		select {
		case <-open:
			return true
		case <-time.After(100 * time.Millisecond): // notice Close
		}
	}
}

func (p *Proxy) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.latency
	if p.jitter > 0 {
		d += rand.N(p.jitter)
	}
	return d
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	once           sync.Once
}

func (l *link) reset() { l.once.Do(func() { rst(l.client); rst(l.server) }) }
func (l *link) close() { l.once.Do(func() { l.client.Close(); l.server.Close() }) }

// rst closes c with an RST rather than a FIN.
func rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		if err := tc.CloseWrite(); err == nil || errors.Is(err, net.ErrClosed) {
			return
		}
	}
	_ = c.Close()
}

var _ io.Closer = (*Proxy)(nil)
