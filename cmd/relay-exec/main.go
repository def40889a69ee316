// Command relay-exec starts the handler of a one-shot container whose task
// was created ahead of demand (docs/runtimes.md "One-shot containers").
//
// The containerd runner bind-mounts it read-only into the container and
// creates the task with relay-exec as its process and the handler's command
// line as its arguments. When an attempt takes the container, the runner
// writes to its stdin a header, a 4-byte big-endian length followed by that
// many bytes of JSON {"env": ["NAME=value", ...]}, then the event. relay-exec
// reads exactly the header, nothing more, and replaces itself (execve) with
// the command under that environment: the handler is the container's PID 1
// and reads the event from the same stdin. Its arguments are resolved like
// execvp does, in the PATH of the header's environment. HOME, when the
// header has none, is relay-exec's own, which runc set as it does for any
// container process.
//
// When the command cannot be executed relay-exec writes one line naming it
// to stderr and exits 127 (no such file) or 126 (not executable), the
// codes a shell gives; a malformed header exits 125.
//
// It must be a static executable (CGO_ENABLED=0 go build): it runs in any
// image, with or without a libc.
package main

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"syscall"
	"time"
)

// maxHeader bounds the header's length.
const maxHeader = 16 << 20

// Exit codes.
const (
	exitBadHeader     = 125
	exitNotExecutable = 126
	exitNotFound      = 127
)

type header struct {
	Env []string `json:"env"`
}

func main() {
	argv := os.Args[1:]
	var h header
	b, err := readHeader()
	if err == nil {
		err = json.Unmarshal(b, &h)
	}
	if err != nil {
		fail(exitBadHeader, "read the header: "+err.Error())
	}
	if len(argv) == 0 {
		fail(exitNotFound, "no command")
	}
	err = execvp(argv, withHome(h.Env))
	code := exitNotExecutable
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, errNotInPath) {
		code = exitNotFound
	}
	fail(code, "exec "+argv[0]+": "+err.Error())
}

// withHome returns env with HOME added from relay-exec's own environment
// when env has none: runc gives a container's process the HOME of its
// user's /etc/passwd entry when the spec sets none, and a handler started
// through relay-exec must see the same environment as one started by runc.
func withHome(env []string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, "HOME=") {
			return env
		}
	}
	if home, ok := os.LookupEnv("HOME"); ok {
		return append(env, "HOME="+home)
	}
	return env
}

// readHeader reads the length-prefixed header from fd 0 with plain reads,
// so that no byte after it is consumed and fd 0 is left as it was.
func readHeader() ([]byte, error) {
	var n [4]byte
	if err := readFull(n[:]); err != nil {
		return nil, err
	}
	size := int(n[0])<<24 | int(n[1])<<16 | int(n[2])<<8 | int(n[3])
	if size > maxHeader {
		return nil, errors.New("header too long")
	}
	b := make([]byte, size)
	return b, readFull(b)
}

func readFull(b []byte) error {
	for len(b) > 0 {
		n, err := syscall.Read(0, b)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			// A non-blocking stdin: wait for the runner's write.
			time.Sleep(time.Millisecond)
			continue
		case err != nil:
			return err
		case n == 0:
			return errors.New("unexpected end of stdin")
		}
		b = b[n:]
	}
	return nil
}

var errNotInPath = errors.New("executable file not found in $PATH")

// execvp replaces the process with argv[0] under env, searching env's PATH
// when argv[0] holds no slash, as execvp(3) does. It returns only on
// failure.
func execvp(argv, env []string) error {
	name := argv[0]
	if strings.Contains(name, "/") {
		return syscall.Exec(name, argv, env)
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	var denied error
	for _, dir := range strings.Split(path, ":") {
		if dir == "" {
			dir = "."
		}
		err := syscall.Exec(dir+"/"+name, argv, env)
		switch {
		case errors.Is(err, syscall.EACCES):
			denied = err
		case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENOTDIR):
		default:
			return err
		}
	}
	if denied != nil {
		return denied
	}
	return errNotInPath
}

// fail writes "relay-exec: msg" to stderr and exits with code.
func fail(code int, msg string) {
	syscall.Write(2, []byte("relay-exec: "+msg+"\n"))
	os.Exit(code)
}
