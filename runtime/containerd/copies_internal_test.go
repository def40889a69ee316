package containerd

import (
	"os"
	"testing"
	"time"

	"github.com/relaydev/relay/runtime"
)

// TestBootstrapCopyInUseIsTouched: a Runner marks the bootstrap copy it
// mounts as used at most once per copyTouch, so that a sweep takes only
// the copies of versions no Runner runs for copyRetention.
func TestBootstrapCopyInUseIsTouched(t *testing.T) {
	b, err := runtime.LookupBootstrap(runtime.RuntimePython3)
	if err != nil {
		t.Fatal(err)
	}
	f := &bootstrapFiles{stateDir: t.TempDir(), verified: map[string]bool{}}
	path, err := f.file(b)
	if err != nil {
		t.Fatal(err)
	}
	mtime := func() time.Time {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.ModTime()
	}
	setAge := func(age time.Duration) {
		at := time.Now().Add(-age)
		if err := os.Chtimes(path, at, at); err != nil {
			t.Fatal(err)
		}
	}

	setAge(time.Hour) // touched an hour ago: not again yet
	before := mtime()
	if _, err := f.file(b); err != nil {
		t.Fatal(err)
	}
	if !mtime().Equal(before) {
		t.Errorf("a copy touched an hour ago was touched again on use")
	}

	setAge(copyTouch + time.Hour)
	if _, err := f.file(b); err != nil {
		t.Fatal(err)
	}
	if age := time.Since(mtime()); age > time.Minute {
		t.Errorf("a copy last touched %v ago is not marked used on use", age.Round(time.Hour))
	}
}

// TestPrivateBootstrapDirRemoved: a Runner without a state directory
// writes its bootstraps to a directory of its own under TMPDIR, which
// Close removes rather than leave one per process.
func TestPrivateBootstrapDirRemoved(t *testing.T) {
	b, err := runtime.LookupBootstrap(runtime.RuntimeNode)
	if err != nil {
		t.Fatal(err)
	}
	f := &bootstrapFiles{verified: map[string]bool{}}
	path, err := f.file(b)
	if err != nil {
		t.Fatal(err)
	}
	dir := f.dir
	f.removePrivate()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("private bootstrap directory %s: stat %v, want it removed", dir, err)
	}
	// Shared state directories are never removed.
	shared := &bootstrapFiles{stateDir: t.TempDir(), verified: map[string]bool{}}
	if path, err = shared.file(b); err != nil {
		t.Fatal(err)
	}
	shared.removePrivate()
	if _, err := os.Stat(path); err != nil {
		t.Errorf("a state directory's bootstrap copy: %v, want it kept", err)
	}
}
