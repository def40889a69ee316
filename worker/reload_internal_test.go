package worker

import (
	"slices"
	"testing"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher"
)

func TestNextGeneration(t *testing.T) {
	valid := func(name, digest string) *app.App {
		return &app.App{Name: name, Digest: digest, Rules: []app.Rule{{Handler: "h.run", Pattern: &matcher.Pattern{}}}}
	}
	invalid := func(name, digest string) *app.App {
		a := valid(name, digest)
		a.Errors.Add(name+"/template.yaml", 3, 5, "", "broken")
		return a
	}
	set := func(apps ...*app.App) *app.Set {
		s, err := app.Loaded(apps)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	prev := set(valid("a", "1"), valid("b", "1"), invalid("c", "1"))

	// Nothing changed: the same set comes back, so nothing is swapped.
	if next, changes := nextGeneration(prev, set(valid("a", "1"), valid("b", "1"), invalid("c", "1"))); next != prev || len(changes) != 0 {
		t.Errorf("unchanged apps: a new generation %v, changes %+v", next != prev, changes)
	}

	next, changes := nextGeneration(prev, set(valid("a", "2"), invalid("b", "2"), invalid("c", "2"), valid("d", "1")))
	want := map[string]string{"a": "changed", "b": "changed kept", "c": "changed", "d": "added"}
	got := map[string]string{}
	for _, c := range changes {
		got[c.app.Name] = c.what
		if c.kept {
			got[c.app.Name] += " kept"
		}
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %q, want %q", name, got[name], w)
		}
	}
	if b := next.Get("b"); b == nil || !b.Available() || b.Digest != "1" {
		t.Errorf("b after an invalid edit = %+v, want the previous valid version", b)
	}
	if c := next.Get("c"); c == nil || c.Available() || c.Digest != "2" {
		t.Errorf("c, never valid = %+v, want the new, unavailable version", c)
	}
	if next.Get("a").Digest != "2" || next.Get("d") == nil {
		t.Error("a changed or d added are not served")
	}

	next, changes = nextGeneration(prev, set(valid("a", "1")))
	if next.Get("b") != nil || len(changes) != 2 || changes[0].what != "removed" {
		t.Errorf("removed apps: %v served, changes %+v", next.Get("b") != nil, changes)
	}
}

// TestRetryTimerDoubles: the delay between retries doubles while
// preparations keep failing, stops at max, and starts again from first
// once none fails; a timer not armed never fires.
func TestRetryTimerDoubles(t *testing.T) {
	r := newRetryTimer(10*time.Millisecond, 35*time.Millisecond)
	defer r.stop()
	if r.c() != nil {
		t.Fatal("a new retry timer is armed")
	}
	var delays []time.Duration
	for range 4 {
		delays = append(delays, r.next)
		r.update(true)
		r.update(true) // a reload in between, the timer armed: no new delay
		<-r.c()
		r.fired()
	}
	if want := []time.Duration{10, 20, 35, 35}; !slices.Equal(delays, scale(want, time.Millisecond)) {
		t.Errorf("delays %v, want %v ms", delays, want)
	}
	r.update(true)
	r.update(false)
	if r.c() != nil || r.next != 10*time.Millisecond {
		t.Errorf("after a load without failures: armed %v, next delay %v; want disarmed, 10ms", r.c() != nil, r.next)
	}
}

func scale(ds []time.Duration, unit time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d * unit
	}
	return out
}
