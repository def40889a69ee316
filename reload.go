package relay

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/schedule"
)

// DefaultReloadInterval is how often a Worker rescans its apps even when
// nothing reported a change: the backstop for a watch that missed one.
const DefaultReloadInterval = 30 * time.Second

// AppWatcher is an optional AppSource capability: Watch calls changed
// whenever the source may have changed, until ctx ends (template.Dir
// watches the apps root). A Worker reloads then, as well as every
// ReloadInterval and on Reload.
type AppWatcher interface {
	Watch(ctx context.Context, changed func()) error
}

// Reload asks the Worker to load its apps again now (relay start does on
// SIGHUP). It does not wait for the reload; a reload already asked for and
// not yet done absorbs the new request. Safe for concurrent use.
func (w *Worker) Reload() {
	select {
	case w.reloads <- struct{}{}:
	default:
	}
}

// reloadLoop reloads the apps whenever a reload is asked for (Reload, the
// source's watch) and every ReloadInterval, until ctx ends
// (docs/apps.md#changing-apps).
func (w *Worker) reloadLoop(ctx context.Context, sched *scheduleRunner) {
	if aw, ok := w.cfg.Apps.(AppWatcher); ok {
		go func() {
			if err := aw.Watch(ctx, w.Reload); err != nil && ctx.Err() == nil {
				w.log.LogAttrs(ctx, slog.LevelWarn, "watching the apps for changes failed; rescanning every reload interval only",
					slog.Duration("interval", w.cfg.ReloadInterval), slog.Any("error", err))
			}
		}()
	}
	t := time.NewTicker(w.cfg.ReloadInterval)
	defer t.Stop()
	retry := newRetryTimer(w.cfg.PrepareRetry, w.cfg.ReloadInterval)
	defer retry.stop()
	retry.update(w.prepareFailed)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.reloads:
		case <-retry.c():
			retry.fired()
		}
		w.reload(ctx, sched)
		retry.update(w.prepareFailed)
	}
}

// retryTimer asks for a reload while a preparation keeps failing: after
// first, then after twice the delay before, up to max, so that an app
// serves soon after what it lacked appears (containerd back, a secret
// written) without a watch for it, and a lasting failure costs a few
// reloads, not one a second (docs/apps.md#changing-apps). Only the reload
// loop uses it.
type retryTimer struct {
	first, max time.Duration
	next       time.Duration // the delay the next arming waits
	t          *time.Timer
	armed      bool
}

func newRetryTimer(first, max time.Duration) *retryTimer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &retryTimer{first: first, max: max, next: min(first, max), t: t}
}

// update arms the timer when failed and it is not armed yet, and disarms
// it and starts the delays again from first when not failed.
func (r *retryTimer) update(failed bool) {
	switch {
	case !failed:
		r.t.Stop()
		r.armed = false
		r.next = min(r.first, r.max)
	case !r.armed:
		r.t.Reset(r.next)
		r.armed = true
		r.next = min(2*r.next, r.max)
	}
}

// c is the channel the timer fires on; nil, which never fires, while it
// is not armed.
func (r *retryTimer) c() <-chan time.Time {
	if !r.armed {
		return nil
	}
	return r.t.C
}

// fired records that the timer fired.
func (r *retryTimer) fired() { r.armed = false }

func (r *retryTimer) stop() { r.t.Stop() }

// reload loads the apps and, when they changed, makes the new generation
// the one new deliveries use.
func (w *Worker) reload(ctx context.Context, sched *scheduleRunner) {
	loaded, err := w.cfg.Apps.Load(ctx)
	if err != nil {
		w.log.LogAttrs(ctx, slog.LevelError, "reloading the apps failed; the previous apps keep serving", slog.Any("error", err))
		return
	}
	prev := w.Apps()
	loaded, waiting := w.prepareApps(ctx, prev, loaded)
	if ctx.Err() != nil {
		return // stopping: a preparation cut short is no version to serve
	}
	next, changes := nextGeneration(prev, loaded)
	for _, c := range changes {
		switch {
		case waiting[c.app.Name] != nil:
			// Reported below, whether or not it is a change.
		case c.kept:
			w.reportInvalid(ctx, c.app, true)
		case c.what == "removed":
			delete(w.invalid, c.app.Name)
			delete(w.waiting, c.app.Name)
			w.log.LogAttrs(ctx, slog.LevelInfo, "app removed", slog.String("app", c.app.Name))
		case !c.app.Available():
			w.reportInvalid(ctx, c.app, false)
		default:
			delete(w.invalid, c.app.Name)
			what := c.what
			switch old := prev.Get(c.app.Name); {
			case old != nil && isBeingPrepared(old):
				what = "loaded" // its first version to serve, as at start
			case old != nil && sameApp(old, c.app):
				// Not ready before (a missing secret, a failed build
				// retried), this template's version now serves.
				what = "ready"
			}
			w.log.LogAttrs(ctx, slog.LevelInfo, "app "+what, slog.String("app", c.app.Name),
				slog.Int("rules", len(c.app.Rules)), slog.Int("schedules", len(c.app.Schedules)))
		}
	}
	for _, a := range loaded.List() {
		if v := waiting[a.Name]; v != nil {
			w.reportPreparing(ctx, v, next.Get(a.Name).Available(), w.prepareWait(prev))
		}
	}
	w.reportFixed(ctx, loaded, changes)
	if next == prev {
		return
	}
	w.setApps(next)
	if inc := next.Incomplete(); len(inc) > 0 {
		w.log.LogAttrs(ctx, slog.LevelError, "apps have rules that could not be read; no message will be acknowledged until their templates are fixed",
			slog.Any("apps", inc))
	}
	if !sameSchedules(prev, next) {
		sched.replace(ctx, next)
	}
}

// reportInvalid logs and counts the errors of invalid app a, kept when its
// previous version keeps serving, unless this version of its template was
// reported already.
func (w *Worker) reportInvalid(ctx context.Context, a *app.App, kept bool) {
	if !w.newlyInvalid(a) {
		return
	}
	w.reloadErrors.WithLabelValues(a.Name).Inc()
	w.logInvalid(ctx, a, kept)
}

// reportPreparing logs, once per version of app a, that a's preparation
// goes on in the background after the load waited for it: kept when its
// previous version keeps serving. It is no error (not counted in
// relay_app_reload_errors_total): the reload the preparation asks for
// when it ends logs the app loaded, changed or not ready.
func (w *Worker) reportPreparing(ctx context.Context, a *app.App, kept bool, waited time.Duration) {
	if v := w.waiting[a.Name]; v != nil && sameApp(v, a) {
		return
	}
	w.waiting[a.Name] = a
	msg := "app being prepared; its messages wait"
	if kept {
		msg = "app being prepared; its previous version keeps serving"
	}
	w.log.LogAttrs(ctx, slog.LevelInfo, msg, slog.String("app", a.Name), slog.Duration("waited", waited))
}

// logInvalid logs each error of invalid app a (invalidMsg).
func (w *Worker) logInvalid(ctx context.Context, a *app.App, kept bool) {
	for _, e := range a.Errors {
		w.log.LogAttrs(ctx, slog.LevelError, invalidMsg(e, kept), slog.String("app", a.Name), slog.String("error", e.Error()))
	}
}

// reportFixed logs, once, that an app whose broken template was reported
// has a valid one again that is the version already serving (the edit was
// undone): no change is logged for it, and the operator who saw the error
// would otherwise not learn that it is over.
func (w *Worker) reportFixed(ctx context.Context, loaded *app.Set, changes []appChange) {
	for name, sig := range w.invalid {
		a := loaded.Get(name)
		if a == nil || !a.Available() || slices.ContainsFunc(changes, func(c appChange) bool { return c.app.Name == name }) {
			continue
		}
		delete(w.invalid, name)
		msg := "app template valid again; the version serving is unchanged"
		if strings.Contains(sig, notReady) {
			// The template was valid: its version could not be prepared.
			msg = "app edit that was not ready undone; the version serving is unchanged"
		}
		w.log.LogAttrs(ctx, slog.LevelInfo, msg, slog.String("app", name))
	}
}

// newlyInvalid reports whether a's invalid template differs from the one
// last reported for its app, and remembers it: a broken template is
// reported (logged, counted in relay_app_reload_errors_total) once when it
// appears, not again at every rescan while it stays broken
// (docs/apps.md#changing-apps). Only the reload loop calls it.
func (w *Worker) newlyInvalid(a *app.App) bool {
	sig := a.Digest + "\x00" + a.Errors.Error()
	if w.invalid[a.Name] == sig {
		return false
	}
	w.invalid[a.Name] = sig
	return true
}

// appChange is what a reload found for one app.
type appChange struct {
	app  *app.App
	what string // added, changed, removed
	// kept: the new template is invalid, and the previous version keeps
	// serving.
	kept bool
}

// nextGeneration returns the apps to serve after loading loaded, given the
// ones served before (prev), and what changed. An app whose template
// became invalid, or whose preparation failed or is still running, keeps
// its previous, valid version; an app that never had a valid template is
// served unavailable, as at start. It returns prev itself when nothing
// changed.
func nextGeneration(prev, loaded *app.Set) (*app.Set, []appChange) {
	var changes []appChange
	var apps []*app.App
	changed := false
	for _, a := range loaded.List() {
		old := prev.Get(a.Name)
		switch {
		case old != nil && sameApp(old, a) && old.Available() == a.Available() && isBeingPrepared(old) == isBeingPrepared(a):
			apps = append(apps, old)
		case old != nil && !a.Available() && old.Available():
			apps = append(apps, old)
			changes = append(changes, appChange{app: a, what: "changed", kept: true})
		case old == nil:
			apps = append(apps, a)
			changes = append(changes, appChange{app: a, what: "added"})
			changed = true
		default:
			apps = append(apps, a)
			changes = append(changes, appChange{app: a, what: "changed"})
			changed = true
		}
	}
	for _, old := range prev.List() {
		if loaded.Get(old.Name) == nil {
			changes = append(changes, appChange{app: old, what: "removed"})
			changed = true
		}
	}
	if !changed {
		return prev, changes
	}
	next, err := app.Loaded(apps)
	if err != nil {
		return prev, nil // names are unique in loaded: unreachable
	}
	return next, changes
}

// sameApp reports whether b is a of an unchanged template.
func sameApp(a, b *app.App) bool {
	if a == b {
		return true
	}
	return a.Digest != "" && a.Digest == b.Digest && a.Spec.Dir == b.Spec.Dir &&
		a.Spec.Deps.Digest() == b.Spec.Deps.Digest()
}

// sameSchedules reports whether a and b publish the same occurrences.
func sameSchedules(a, b *app.Set) bool {
	key := func(s schedule.Spec) string {
		return strings.Join([]string{s.App, s.Name, s.Handler, s.Cron.String(), s.Cron.Location().String()}, "\x00")
	}
	var ka, kb []string
	for _, s := range a.ScheduleSpecs() {
		ka = append(ka, key(s))
	}
	for _, s := range b.ScheduleSpecs() {
		kb = append(kb, key(s))
	}
	return slices.Equal(ka, kb)
}

// scheduleRunner runs the Scheduler of the current apps' schedules and
// replaces it when they change. A Scheduler that fails ends the worker:
// running without its schedules would silently drop occurrences.
type scheduleRunner struct {
	w    *Worker
	fail func(error)

	cancel context.CancelFunc
	done   chan struct{}
}

// replace stops the running Scheduler, if any, and starts one for apps'
// schedules, if they have any. The outbox carries over: it lives in the
// state directory, not in the Scheduler.
func (s *scheduleRunner) replace(ctx context.Context, apps *app.Set) {
	s.stop()
	sched, err := s.w.scheduler(apps)
	if err != nil {
		s.fail(err)
		return
	}
	if sched == nil {
		return
	}
	sctx, cancel := context.WithCancel(ctx)
	s.cancel, s.done = cancel, make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		if err := sched.Run(sctx); err != nil && sctx.Err() == nil {
			s.fail(fmt.Errorf("schedules: %w", err))
		}
	}(s.done)
}

// stop stops the running Scheduler and waits for it.
func (s *scheduleRunner) stop() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
		s.cancel, s.done = nil, nil
	}
}
