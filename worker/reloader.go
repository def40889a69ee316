package worker

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
)

// reloader loads the apps at start and again whenever a reload is asked
// for (Reload, the source's watch), every reload interval, and after a
// failed preparation (retryTimer), and swaps in the next generation of
// apps (docs/apps.md#changing-apps): nextGeneration decides what serves,
// prepareApps readies it, and serve hands it to the Engines and the
// schedules. It reports each app's change, invalid template or
// preparation once.
type reloader struct {
	cfg      reloaderConfig
	log      *slog.Logger
	errors   *prometheus.CounterVec // relay_app_reload_errors_total
	requests chan struct{}
	runner   relay.Runner
	// serve makes next, which follows prev, the generation of apps the
	// Worker serves.
	serve func(ctx context.Context, prev, next *app.Set)

	mu   sync.Mutex
	apps *app.Set // served; nil before start

	// preparing owns the goroutines of the preparations.
	preparing sync.WaitGroup
	// The rest is used by start, then by Run alone. invalid holds, by app
	// name, the invalid template last reported (newlyInvalid); preps, the
	// preparation of an app that is running or whose result no reload has
	// used yet (prepareApps); waiting, the version of each app last logged
	// as being prepared (reportPreparing); retry, the timer of the next
	// reload after a failed preparation.
	invalid map[string]string
	// mismatch is the handler check error last logged by a reload.
	mismatch string
	preps    map[string]*preparation
	waiting  map[string]*app.App
	retry    *retryTimer
}

// reloaderConfig is what a reloader loads and how long it waits.
type reloaderConfig struct {
	apps                                AppSource
	preparer                            relay.Preparer // nil: apps need no preparation
	interval, prepareWait, prepareRetry time.Duration
}

func newReloader(cfg Config, log *slog.Logger, reg prometheus.Registerer, serve func(ctx context.Context, prev, next *app.Set)) (*reloader, error) {
	rc := reloaderConfig{apps: cfg.Apps, interval: cfg.ReloadInterval, prepareWait: cfg.PrepareWait, prepareRetry: cfg.PrepareRetry}
	rc.preparer, _ = cfg.Runner.(relay.Preparer)
	r := &reloader{cfg: rc, log: log, serve: serve, runner: cfg.Runner, requests: make(chan struct{}, 1),
		invalid: map[string]string{}, preps: map[string]*preparation{}, waiting: map[string]*app.App{},
		retry: newRetryTimer(cfg.PrepareRetry, cfg.ReloadInterval)}
	r.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Name: "app_reload_errors_total",
		Help: "Reloads that found an app's template invalid (its previous version, if any, keeps serving)."}, []string{"app"})
	if err := reg.Register(r.errors); err != nil {
		return nil, fmt.Errorf("worker: register reload metrics: %w", err)
	}
	return r, nil
}

// Reload asks for a reload now; a request not yet served absorbs it.
func (r *reloader) Reload() {
	select {
	case r.requests <- struct{}{}:
	default:
	}
}

// Apps returns the apps served; nil before start.
func (r *reloader) Apps() *app.Set {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.apps
}

func (r *reloader) setApps(apps *app.Set) {
	r.mu.Lock()
	r.apps = apps
	r.mu.Unlock()
}

// load loads the apps at start: an error when the source cannot be read
// or holds none (ErrNoApps).
func (r *reloader) load(ctx context.Context) (*app.Set, error) {
	apps, err := r.cfg.apps.Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("worker: load apps: %w", err)
	}
	if len(apps.List()) == 0 {
		return nil, ErrNoApps
	}
	if err := relay.CheckHandlers(apps, r.runner); relay.Refuses(err) {
		return nil, fmt.Errorf("worker: %w", err)
	}
	return apps, nil
}

// start prepares the apps load returned and makes them the ones served,
// logging what each is; false when ctx ended first, and nothing is
// served.
func (r *reloader) start(ctx context.Context, loaded *app.Set) bool {
	apps, waiting, failed := r.prepareApps(ctx, nil, loaded)
	if ctx.Err() != nil {
		// Stopped while preparing: an app whose preparation was cut short
		// is not ready.
		return false
	}
	r.retry.update(failed)
	for _, a := range apps.List() {
		if v := waiting[a.Name]; v != nil {
			r.reportPreparing(ctx, v, false, r.prepareWait(nil))
			continue
		}
		if !a.Available() {
			r.newlyInvalid(a)
			r.logInvalid(ctx, a, false)
			continue
		}
		r.log.LogAttrs(ctx, slog.LevelInfo, "app loaded", slog.String("app", a.Name),
			slog.Int("rules", len(a.Rules)), slog.Int("schedules", len(a.Schedules)))
	}
	r.setApps(apps)
	return true
}

// Run reloads whenever a reload is asked for and every reload interval,
// until ctx ends, then waits for the preparations it started.
func (r *reloader) Run(ctx context.Context) {
	defer r.retry.stop()
	if aw, ok := r.cfg.apps.(AppWatcher); ok {
		go func() {
			if err := aw.Watch(ctx, r.Reload); err != nil && ctx.Err() == nil {
				r.log.LogAttrs(ctx, slog.LevelWarn, "watching the apps for changes failed; rescanning every reload interval only",
					slog.Duration("interval", r.cfg.interval), slog.Any("error", err))
			}
		}()
	}
	t := time.NewTicker(r.cfg.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.requests:
		case <-r.retry.c():
			r.retry.fired()
		}
		r.reload(ctx)
	}
}

// retryTimer asks for a reload while a preparation keeps failing: after
// first, then after twice the delay before, up to max, so that an app
// serves soon after what it lacked appears (containerd back, a secret
// written) without a watch for it, and a lasting failure costs a few
// reloads, not one a second (docs/apps.md#changing-apps). Only the reloader uses it.
type retryTimer struct {
	first, max time.Duration
	next       time.Duration // the delay the next arming waits
	t          *time.Timer
	armed      bool
	failing    bool // as last updated
}

func newRetryTimer(first, max time.Duration) *retryTimer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &retryTimer{first: first, max: max, next: min(first, max), t: t}
}

// update arms the timer when failed and it is not armed yet, and disarms
// it and starts the delays again from first when not failed.
func (r *retryTimer) update(failed bool) {
	r.failing = failed
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

// reload loads the apps and, when they changed, serves the next
// generation.
func (r *reloader) reload(ctx context.Context) {
	loaded, err := r.cfg.apps.Load(ctx)
	if err != nil {
		r.log.LogAttrs(ctx, slog.LevelError, "reloading the apps failed; the previous apps keep serving", slog.Any("error", err))
		r.retry.update(r.retry.failing) // the failed preparation is still to retry
		return
	}
	// Go functions are registered at build time: a reload that names a
	// handler the Runner does not serve is refused whole, logged once per
	// distinct mismatch (docs/embedding.md#go-handlers).
	if err := relay.CheckHandlers(loaded, r.runner); relay.Refuses(err) {
		if msg := err.Error(); msg != r.mismatch {
			r.mismatch = msg
			r.log.LogAttrs(ctx, slog.LevelError, "the reloaded apps name handlers the runner does not serve; the previous apps keep serving", slog.Any("error", err))
		}
		return
	}
	r.mismatch = ""
	prev := r.Apps()
	loaded, waiting, failed := r.prepareApps(ctx, prev, loaded)
	if ctx.Err() != nil {
		return // stopping: a preparation cut short is no version to serve
	}
	r.retry.update(failed)
	next, changes := nextGeneration(prev, loaded)
	r.reportChanges(ctx, prev, changes, waiting)
	for _, a := range loaded.List() {
		if v := waiting[a.Name]; v != nil {
			r.reportPreparing(ctx, v, next.Get(a.Name).Available(), r.prepareWait(prev))
		}
	}
	r.reportFixed(ctx, loaded, changes)
	if next == prev {
		return
	}
	r.setApps(next)
	if inc := next.Incomplete(); len(inc) > 0 {
		r.log.LogAttrs(ctx, slog.LevelError, "apps have rules that could not be read; no message will be acknowledged until their templates are fixed",
			slog.Any("apps", inc))
	}
	r.serve(ctx, prev, next)
}

// reportChanges logs each change a reload found, but those of apps still
// being prepared (waiting), which reportPreparing logs.
func (r *reloader) reportChanges(ctx context.Context, prev *app.Set, changes []appChange, waiting map[string]*app.App) {
	for _, c := range changes {
		switch {
		case waiting[c.app.Name] != nil:
		case c.kept:
			r.reportInvalid(ctx, c.app, true)
		case c.what == "removed":
			delete(r.invalid, c.app.Name)
			delete(r.waiting, c.app.Name)
			r.log.LogAttrs(ctx, slog.LevelInfo, "app removed", slog.String("app", c.app.Name))
		case !c.app.Available():
			r.reportInvalid(ctx, c.app, false)
		default:
			delete(r.invalid, c.app.Name)
			what := c.what
			switch old := prev.Get(c.app.Name); {
			case old != nil && isBeingPrepared(old):
				what = "loaded" // its first version to serve, as at start
			case old != nil && sameApp(old, c.app):
				// Not ready before (a missing secret, a failed build
				// retried), this template's version now serves.
				what = "ready"
			}
			r.log.LogAttrs(ctx, slog.LevelInfo, "app "+what, slog.String("app", c.app.Name),
				slog.Int("rules", len(c.app.Rules)), slog.Int("schedules", len(c.app.Schedules)))
		}
	}
}

// reportInvalid logs and counts the errors of invalid app a, kept when its
// previous version keeps serving, unless this version of its template was
// reported already.
func (r *reloader) reportInvalid(ctx context.Context, a *app.App, kept bool) {
	if !r.newlyInvalid(a) {
		return
	}
	r.errors.WithLabelValues(a.Name).Inc()
	r.logInvalid(ctx, a, kept)
}

// reportPreparing logs, once per version of app a, that a's preparation
// goes on in the background after the load waited for it: kept when its
// previous version keeps serving. It is no error (not counted in
// relay_app_reload_errors_total): the reload the preparation asks for
// when it ends logs the app loaded, changed or not ready.
func (r *reloader) reportPreparing(ctx context.Context, a *app.App, kept bool, waited time.Duration) {
	if v := r.waiting[a.Name]; v != nil && sameApp(v, a) {
		return
	}
	r.waiting[a.Name] = a
	msg := "app being prepared; its messages wait"
	if kept {
		msg = "app being prepared; its previous version keeps serving"
	}
	r.log.LogAttrs(ctx, slog.LevelInfo, msg, slog.String("app", a.Name), slog.Duration("waited", waited))
}

// logInvalid logs each error of invalid app a (invalidMsg).
func (r *reloader) logInvalid(ctx context.Context, a *app.App, kept bool) {
	for _, e := range a.Errors {
		r.log.LogAttrs(ctx, slog.LevelError, invalidMsg(e, kept), slog.String("app", a.Name), slog.String("error", e.Error()))
	}
}

// reportFixed logs, once, that an app whose broken template was reported
// has a valid one again that is the version already serving (the edit was
// undone): no change is logged for it, and the operator who saw the error
// would otherwise not learn that it is over.
func (r *reloader) reportFixed(ctx context.Context, loaded *app.Set, changes []appChange) {
	for name, sig := range r.invalid {
		a := loaded.Get(name)
		if a == nil || !a.Available() || slices.ContainsFunc(changes, func(c appChange) bool { return c.app.Name == name }) {
			continue
		}
		delete(r.invalid, name)
		msg := "app template valid again; the version serving is unchanged"
		if strings.Contains(sig, notReady) {
			// The template was valid: its version could not be prepared.
			msg = "app edit that was not ready undone; the version serving is unchanged"
		}
		r.log.LogAttrs(ctx, slog.LevelInfo, msg, slog.String("app", name))
	}
}

// newlyInvalid reports whether a's invalid template differs from the one
// last reported for its app, and remembers it: a broken template is
// reported (logged, counted in relay_app_reload_errors_total) once when it
// appears, not again at every rescan while it stays broken
// (docs/apps.md#changing-apps). Only start and Run call it.
func (r *reloader) newlyInvalid(a *app.App) bool {
	sig := a.Digest + "\x00" + a.Errors.Error()
	if r.invalid[a.Name] == sig {
		return false
	}
	r.invalid[a.Name] = sig
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
