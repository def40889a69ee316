package runtime

import (
	"bytes"
	"io"
	"os"
	"reflect"
	"sync"
)

// MaxLineBytes caps the length of one forwarded line, prefix excluded. A
// longer line is split into several prefixed lines; nothing is dropped.
const MaxLineBytes = 64 << 10

// Output is a destination shared by many LineWriters, for example os.Stdout
// shared by all concurrent handlers. It serialises writes to W, so lines of
// different handlers never interleave even when W itself is not safe for
// concurrent use. Use it through a pointer; the zero value with W set is
// ready.
type Output struct {
	W  io.Writer
	mu sync.Mutex
}

// NewOutput returns w when it already is an *Output, and wraps it otherwise.
func NewOutput(w io.Writer) *Output {
	if o, ok := w.(*Output); ok {
		return o
	}
	return &Output{W: w}
}

// SharedOutputs wraps stdout and stderr in Outputs, sharing one when both are
// the same writer so that its lines never interleave either.
func SharedOutputs(stdout, stderr io.Writer) (out, errOut *Output) {
	out = NewOutput(stdout)
	if sameWriter(stdout, stderr) {
		return out, out
	}
	return out, NewOutput(stderr)
}

func sameWriter(a, b io.Writer) bool {
	if a == nil || b == nil {
		return a == b
	}
	if reflect.TypeOf(a) != reflect.TypeOf(b) || !reflect.TypeOf(a).Comparable() {
		return false
	}
	return a == b
}

// Write writes p to W while holding the Output's lock.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.W.Write(p)
}

// LineWriter returns a LineWriter writing to o.
func (o *Output) LineWriter(prefix string) *LineWriter {
	return NewLineWriter(o, prefix)
}

// Prefix returns the line prefix of an invocation: "[<app>/<handler>] ".
func Prefix(app, handler string) string {
	return "[" + app + "/" + handler + "] "
}

// LineWriter forwards a byte stream line by line, each line prefixed. Every
// line, prefix and trailing newline included, reaches the destination in a
// single Write call; wrap a destination shared by concurrent LineWriters in
// an *Output so those calls are serialised. Lines are forwarded verbatim ("\r"
// included); a line longer than MaxLineBytes is split. Close flushes a
// trailing partial line, adding the newline.
//
// Write never fails because the destination did: a handler must not stall
// or fail because its log sink broke. The first destination error is kept,
// later output is discarded, and Close returns that error.
//
// A LineWriter is safe for concurrent use.
type LineWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix int    // length of the prefix at the start of buf
	buf    []byte // prefix followed by the pending line
	err    error  // first error from w
	closed bool
	last   []byte // the last non-blank line, without prefix, at most maxLastLine bytes
}

// maxLastLine bounds what LastLine keeps: enough for an error message.
const maxLastLine = 240

var _ io.WriteCloser = (*LineWriter)(nil)

// NewLineWriter returns a LineWriter that writes to w, each line starting
// with prefix (typically Prefix(app, handler)).
func NewLineWriter(w io.Writer, prefix string) *LineWriter {
	buf := make([]byte, len(prefix), len(prefix)+256)
	copy(buf, prefix)
	return &LineWriter{w: w, prefix: len(prefix), buf: buf}
}

// Write buffers p and forwards every line it completes. It returns len(p)
// unless the LineWriter is closed (os.ErrClosed).
func (l *LineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, os.ErrClosed
	}
	n := len(p)
	for len(p) > 0 {
		room := MaxLineBytes - (len(l.buf) - l.prefix)
		i := bytes.IndexByte(p, '\n')
		switch {
		case i >= 0 && i <= room: // the line ends within the cap
			l.buf = append(l.buf, p[:i+1]...)
			l.flush()
			p = p[i+1:]
		case i < 0 && len(p) <= room: // partial line: keep it for later
			l.buf = append(l.buf, p...)
			p = nil
		default: // too long: forward MaxLineBytes as a line of its own
			l.buf = append(l.buf, p[:room]...)
			l.buf = append(l.buf, '\n')
			l.flush()
			p = p[room:]
		}
	}
	return n, nil
}

// Close forwards a pending partial line followed by a newline. It returns the
// first error the destination reported, if any. Close is idempotent.
func (l *LineWriter) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.err
	}
	l.closed = true
	if len(l.buf) > l.prefix {
		l.buf = append(l.buf, '\n')
		l.flush()
	}
	return l.err
}

// LastLine returns the last non-blank line written so far (complete or
// flushed by Close), without the prefix, cut to 240 bytes. Runners put the
// last line of stderr into ExitError so a failure says why.
func (l *LineWriter) LastLine() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.last)
}

// flush writes buf (one complete line) and resets it to the prefix.
func (l *LineWriter) flush() {
	if line := bytes.TrimSpace(l.buf[l.prefix:]); len(line) > 0 {
		l.last = append(l.last[:0], line[:min(len(line), maxLastLine)]...)
	}
	if l.err == nil {
		if _, err := l.w.Write(l.buf); err != nil {
			l.err = err
		}
	}
	l.buf = l.buf[:l.prefix]
	if cap(l.buf) > 4*MaxLineBytes {
		l.buf = append(make([]byte, 0, l.prefix+256), l.buf...)
	}
}
