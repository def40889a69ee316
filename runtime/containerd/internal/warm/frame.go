package warm

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sync"
)

// Warm containers speak a line protocol with the bootstrap's warm mode
// (runtime/bootstrap/*: "Warm mode"). A request is one JSON line on the
// container's stdin; the outcome comes back in-band, on the same streams as
// the handler's output:
//
//	stderr: <token>\n
//	stdout: <token> {"code": N, "clean": B}\n
//
// where token is a random string made for that request alone. The handler
// never sees it, so nothing it prints can be taken for a frame, not even a
// line copied from an earlier invocation's log. The frames are found
// anywhere in the byte stream, not only at a line start: a handler may end
// without a newline. Because each frame follows the handler's output on its
// own pipe, seeing both frames means that all the invocation's output has
// been forwarded, which is what lets Run attribute every line to the right
// invocation. B reports that the bootstrap killed and reaped every process
// the invocation left behind; when it is false or absent the container is
// not used again.

// warmRequest is the request line written to a warm container's stdin.
type warmRequest struct {
	Token   string            `json:"token"`
	Handler string            `json:"handler"`
	Env     map[string]string `json:"env"`
	// Event is the event's JSON text, as a string, so that an event that
	// is not JSON reaches the bootstrap (which reports it, exit code 2)
	// instead of breaking the request line.
	Event string `json:"event"`
}

// warmOutcome is the payload of the stdout frame.
type warmOutcome struct {
	Code  *int `json:"code"`
	Clean bool `json:"clean"`
}

// newToken returns a fresh request token: 128 random bits, hex, behind a
// fixed prefix that makes a frame recognisable in a raw capture.
func newToken() string {
	var b [16]byte
	rand.Read(b[:])
	return "relay-frame-" + hex.EncodeToString(b[:])
}

// parseOutcome decodes a stdout frame's payload into an exit code and
// whether the container is clean (no process of the invocation left).
func parseOutcome(payload []byte) (code int, clean bool, err error) {
	var o warmOutcome
	if err := json.Unmarshal(payload, &o); err != nil || o.Code == nil {
		return 0, false, fmt.Errorf("malformed outcome frame %q from the bootstrap", payload)
	}
	return *o.Code, o.Clean, nil
}

// demux is the writer containerd copies one output stream of a warm
// container into. Between begin and the frame with begin's token it
// forwards to the invocation's writer; otherwise to the container's idle
// writer (output of a handler's background work between invocations). The
// frame itself is not forwarded: its payload (the bytes between the token
// and the end of the line, trimmed) is sent on the channel begin returned.
//
// Write always reports success: an error would stop containerd's copy and,
// once the pipe filled, block the container for good.
type demux struct {
	mu      sync.Mutex
	idle    io.Writer
	sink    io.Writer // the invocation's writer, or idle
	token   []byte    // nil when no invocation is waiting for a frame
	carry   []byte    // end of the last Write that may begin the token
	inFrame bool
	frame   []byte
	done    chan []byte
}

func newDemux(idle io.Writer) *demux { return &demux{idle: idle, sink: idle} }

// begin routes output to w until the frame with token arrives, whose
// payload the returned channel then receives (once).
func (d *demux) begin(token string, w io.Writer) <-chan []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.flushCarry()
	d.token, d.sink, d.inFrame, d.frame = []byte(token), w, false, nil
	d.done = make(chan []byte, 1)
	return d.done
}

// end stops routing output to the invocation's writer, whether or not its
// frame came, so that the writer can be closed.
func (d *demux) end() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.flushCarry()
	d.token, d.sink, d.inFrame, d.frame = nil, d.idle, false, nil
}

func (d *demux) flushCarry() {
	if len(d.carry) > 0 {
		d.sink.Write(d.carry)
		d.carry = nil
	}
}

func (d *demux) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := len(p)
	data := p
	if len(d.carry) > 0 {
		data = append(d.carry, p...)
		d.carry = nil
	}
	for len(data) > 0 {
		if d.inFrame {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				if len(d.frame) < 4096 { // a frame is short; never grow unbounded
					d.frame = append(d.frame, data...)
				}
				return n, nil
			}
			d.frame = append(d.frame, data[:i]...)
			data = data[i+1:]
			d.done <- bytes.TrimSpace(d.frame)
			d.token, d.sink, d.inFrame, d.frame = nil, d.idle, false, nil
			continue
		}
		if d.token == nil {
			d.sink.Write(data)
			return n, nil
		}
		if i := bytes.Index(data, d.token); i >= 0 {
			if i > 0 {
				d.sink.Write(data[:i])
			}
			data = data[i+len(d.token):]
			d.inFrame = true
			continue
		}
		// Hold back a tail that may be the start of the token, split
		// across two writes.
		k := partialSuffix(data, d.token)
		if k < len(data) {
			d.sink.Write(data[:len(data)-k])
		}
		if k > 0 {
			d.carry = append([]byte(nil), data[len(data)-k:]...)
		}
		return n, nil
	}
	return n, nil
}

// partialSuffix returns the length of the longest end of data that is a
// proper prefix of token.
func partialSuffix(data, token []byte) int {
	for k := min(len(token)-1, len(data)); k > 0; k-- {
		if bytes.HasSuffix(data, token[:k]) {
			return k
		}
	}
	return 0
}
