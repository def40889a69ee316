package worker

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher"
)

// preparation is the Prepare call of one version of an app. It may
// outlast the start or reload that began it; its result is kept until a
// reload of the same version uses it.
type preparation struct {
	app    *app.App // the version prepared
	cancel context.CancelFunc
	done   chan struct{} // closed, under mu, when Prepare returned, err set
	err    error

	mu sync.Mutex
	// detached: a load went on without its result, so it asks for the
	// reload that uses it when it ends.
	detached bool
}

// detach reports whether Prepare is still running and, if it is, makes
// it ask for a reload when it ends. Only a preparation a load leaves
// running asks: one whose result its own load used asking too would make
// every failing preparation start the next at once, a reload loop that
// spins as long as the failure lasts.
func (p *preparation) detach() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return false
	default:
		p.detached = true
		return true
	}
}

// finish records Prepare's result, closes done and reports whether a
// reload must use the result.
func (p *preparation) finish(err error) (reload bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
	close(p.done)
	return p.detached
}

// prepareApps prepares, concurrently, each available app of loaded that
// is not served unchanged and available in prev (nil at start), and
// returns the apps to take in place of loaded, with those of loaded whose
// preparation is still running, by name, and whether one failed. It waits
// at most PrepareWait at start, and at most maxReloadPrepareWait of it on
// a reload, for the preparations it starts; one still running then goes
// on in the background and asks for a reload when it ends, and its app
// comes back unavailable as being prepared. A preparation of the same
// version of an app, started before and still running or not yet used, is
// used instead of a new one; one of another version, or of an app no
// longer to prepare, is cancelled. An app whose preparation failed comes
// back unavailable with the error. When ctx ends first, the result means
// nothing: the caller must not serve it.
func (r *reloader) prepareApps(ctx context.Context, prev, loaded *app.Set) (_ *app.Set, running map[string]*app.App, failed bool) {
	if r.cfg.preparer == nil {
		return loaded, nil, false
	}
	started := r.startPreparations(ctx, prev, loaded)
	waitPreparations(ctx, started, r.prepareWait(prev))
	if ctx.Err() != nil {
		return loaded, nil, false
	}
	return r.usePreparations(loaded)
}

// startPreparations starts the preparations prepareApps waits for, and
// cancels those no longer wanted.
func (r *reloader) startPreparations(ctx context.Context, prev, loaded *app.Set) []*preparation {
	wanted := map[string]bool{}
	var started []*preparation
	for _, a := range loaded.List() {
		if !a.Available() {
			continue
		}
		if prev != nil {
			if old := prev.Get(a.Name); old != nil && old.Available() && sameApp(old, a) {
				continue
			}
		}
		wanted[a.Name] = true
		if pr := r.preps[a.Name]; pr != nil {
			if sameApp(pr.app, a) {
				continue // running, or ended and not used yet
			}
			pr.cancel() // another version's: its result would not be used
		}
		pr := r.prepare(ctx, a)
		r.preps[a.Name] = pr
		started = append(started, pr)
	}
	for name, pr := range r.preps {
		if !wanted[name] {
			// The app was removed, broken, or edited back to the version
			// serving.
			pr.cancel()
			delete(r.preps, name)
			delete(r.waiting, name)
		}
	}
	return started
}

// usePreparations returns loaded with each app whose preparation is still
// running or failed made unavailable, the apps still being prepared, and
// whether a preparation failed.
func (r *reloader) usePreparations(loaded *app.Set) (_ *app.Set, running map[string]*app.App, failed bool) {
	apps := slices.Clone(loaded.List())
	replaced := false
	running = map[string]*app.App{}
	for i, a := range apps {
		pr := r.preps[a.Name]
		switch {
		case pr == nil:
			continue
		case pr.detach():
			apps[i] = withError(a, beingPrepared)
			running[a.Name] = a
		case pr.err != nil:
			delete(r.preps, a.Name)
			failed = true
			apps[i] = withError(a, notReady+pr.err.Error())
		default:
			delete(r.preps, a.Name)
			continue
		}
		replaced = true
	}
	if !replaced {
		return loaded, running, failed
	}
	set, err := app.Loaded(apps)
	if err != nil {
		return loaded, running, failed // the names are loaded's: unreachable
	}
	return set, running, failed
}

// prepare starts preparing a in the background, bounded by ctx. When it
// ends after its load went on without it (detach), and was not cancelled,
// it asks for a reload, which uses its result.
func (r *reloader) prepare(ctx context.Context, a *app.App) *preparation {
	pctx, cancel := context.WithCancel(ctx)
	pr := &preparation{app: a, cancel: cancel, done: make(chan struct{})}
	r.preparing.Go(func() {
		defer cancel()
		err := r.cfg.preparer.Prepare(pctx, a.Name, a.Spec)
		if pctx.Err() != nil {
			// Stopping, or another version replaced this one: the error
			// says nothing about the app.
			err = pctx.Err()
		}
		reload := pr.finish(err)
		if reload && pctx.Err() == nil {
			r.Reload()
		}
	})
	return pr
}

// maxReloadPrepareWait bounds PrepareWait on a reload
// (docs/apps.md#changing-apps).
const maxReloadPrepareWait = time.Second

// prepareWait is how long a load waits for the preparations it starts:
// PrepareWait at start (prev nil); on a reload at most
// maxReloadPrepareWait, since a reload also serves the other apps'
// changes, and a new app's events are matched only once it is served: one
// app's pull or build must not hold them up.
func (r *reloader) prepareWait(prev *app.Set) time.Duration {
	if prev == nil {
		return r.cfg.prepareWait
	}
	return min(r.cfg.prepareWait, maxReloadPrepareWait)
}

// waitPreparations waits until every preparation of prs ended, wait
// passed, or ctx ended.
func waitPreparations(ctx context.Context, prs []*preparation, wait time.Duration) {
	if len(prs) == 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for _, pr := range prs {
		select {
		case <-pr.done:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// withError returns a copy of a with one more error, msg: a itself may be
// the app an AppSource returns again at the next load (Static).
func withError(a *app.App, msg string) *app.App {
	c := *a
	c.Errors = slices.Clone(a.Errors)
	c.Errors.Add(a.File, 0, 0, "", msg)
	return &c
}

// isBeingPrepared reports whether a stands for an app whose preparation is
// running (prepareApps).
func isBeingPrepared(a *app.App) bool {
	return len(a.Errors) == 1 && a.Errors[0].Msg == beingPrepared
}

// notReady starts the error a failed preparation adds to an app.
const notReady = "app not ready: "

// beingPrepared is the error of an app whose preparation is running.
const beingPrepared = "app being prepared; it serves once its image is present, its dependencies built and its secrets checked"

// invalidMsg is the log message of an invalid app's error e: the app is
// unavailable, or kept, when its previous version keeps serving.
func invalidMsg(e *matcher.PosError, kept bool) string {
	unready := strings.HasPrefix(e.Msg, notReady)
	switch {
	case kept && unready:
		return "app not ready; its previous version keeps serving"
	case kept:
		return "app template invalid; its previous version keeps serving"
	case unready:
		return "app unavailable: not ready"
	}
	return "app unavailable: invalid template"
}
