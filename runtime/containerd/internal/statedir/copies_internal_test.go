package statedir

import (
	"os"
	"testing"
	"time"

	"github.com/relaydev/relay/runtime"
)

// TestBootstrapCopyInUseIsTouched: a Runner marks the bootstrap copy it
// mounts as used at most once per touchInterval, so that a sweep takes only
// the copies of versions no Runner runs for Retention.
func TestBootstrapCopyInUseIsTouched(t *testing.T) {
	b, err := runtime.LookupBootstrap(runtime.RuntimePython3)
	if err != nil {
		t.Fatal(err)
	}
	f := NewBootstraps(t.TempDir())
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

	setAge(touchInterval + time.Hour)
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
	f := NewBootstraps("")
	path, err := f.file(b)
	if err != nil {
		t.Fatal(err)
	}
	dir := f.dir
	f.RemovePrivate()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("private bootstrap directory %s: stat %v, want it removed", dir, err)
	}
	// Shared state directories are never removed.
	shared := NewBootstraps(t.TempDir())
	if path, err = shared.file(b); err != nil {
		t.Fatal(err)
	}
	shared.RemovePrivate()
	if _, err := os.Stat(path); err != nil {
		t.Errorf("a state directory's bootstrap copy: %v, want it kept", err)
	}
}
