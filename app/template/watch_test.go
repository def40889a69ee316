package template_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"
)

// watchFor runs Dir(root).Watch until the test ends, counting its reports,
// and returns the count and a stop that cancels the watch and returns its
// error, failing the test if Watch does not return.
func watchFor(t *testing.T, root string) (reports *atomic.Int64, stop func() error) {
	t.Helper()
	reports = &atomic.Int64{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		err := template.Dir(root).Watch(ctx, func() { reports.Add(1) })
		if ctx.Err() == nil {
			t.Errorf("Watch returned before its context ended: %v", err)
		}
		done <- err
	}()
	stopped := false
	var result error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case result = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("Watch did not return 30s after its context ended: it is stuck")
			}
		}
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return reports, stop
}

// waitReport waits until reports exceeds n, failing after 30s.
func waitReport(t *testing.T, reports *atomic.Int64, n int64, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for reports.Load() <= n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no report from Watch within 30s (reports: %d)", what, reports.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWatchSurvivesAStormOfEdits: app directories created, edited, renamed
// and removed as fast as the test can, while Watch adds watches for what
// appears. The watch must keep reporting (a watch stuck behind its own
// event reader reports nothing again) and return when its context ends.
func TestWatchSurvivesAStormOfEdits(t *testing.T) {
	root := t.TempDir()
	reports, stop := watchFor(t, root)
	waitReport(t, reports, 0, "the watch set up") // its first report
	write := func(dir, text string) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, app.TemplateFile), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3000 {
		dir := filepath.Join(root, fmt.Sprintf("app%d", i%20))
		write(dir, fmt.Sprintf("image: x\n# %d\n", i))
		// Renamed then removed: the watch of the directory may be gone
		// by the time its rename is read.
		moved := dir + ".old"
		if err := os.Rename(dir, moved); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(moved); err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 {
			write(dir, "image: y\n")
		}
	}
	n := reports.Load()
	write(filepath.Join(root, "last"), "image: z\n")
	waitReport(t, reports, n, "an edit after the storm")
	if err := stop(); err != nil {
		t.Errorf("Watch returned %v after its context ended, want nil", err)
	}
}

// TestWatchReportsWhenItStarts: a change made after the caller loaded the
// apps but before the watch began reaches no watch; Watch's report once
// its watches are in place makes the caller load again, so the change is
// not missed until the next periodic rescan.
func TestWatchReportsWhenItStarts(t *testing.T) {
	root := t.TempDir()
	reports, _ := watchFor(t, root)
	waitReport(t, reports, 0, "a watch that saw no change")
	time.Sleep(2 * settleWait) // nothing else to report
	if n := reports.Load(); n != 1 {
		t.Errorf("%d reports without a change, want the one at start", n)
	}
}

// settleWait is longer than Watch's settling delay.
const settleWait = 300 * time.Millisecond
