package relay

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
)

// DefaultPrepareRetry is the first delay before a Worker prepares again an
// app whose preparation failed (docs/apps.md#changing-apps).
const DefaultPrepareRetry = time.Second

// DefaultPrepareWait is how long a Worker waits at start for the
// preparations it starts before it goes on without the ones still running
// (docs/apps.md#changing-apps); a reload waits at most 1 second.
const DefaultPrepareWait = 10 * time.Second

// Preparer is an optional Runner capability: Prepare readies what an app
// needs before its handlers run, such as its image
// (docs/runtimes.md#images), its dependency image
// (docs/runtimes.md#dependencies) and its secrets (docs/apps.md#secrets),
// and waits for it until ctx ends. A Worker calls it for every available
// app, at start and whenever a reload finds the app new or changed (or
// not ready before), and waits for it at most WorkerConfig.PrepareWait: a
// preparation still running then goes on in the background, the app is
// unavailable ("app being prepared") or, on a reload, its previous version
// keeps serving, and the Worker reloads when it ends. An error makes the
// app unavailable with the error as its reason, so its messages stay
// pending, and on a reload the app's previous version keeps serving; the
// next reload prepares it again. Safe for concurrent use.
type Preparer interface {
	Prepare(ctx context.Context, app string, spec runtime.Spec) error
}

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
// preparation is still running, by name. It waits at most PrepareWait at
// start, and at most maxReloadPrepareWait of it on a reload, for the
// preparations it starts; one still running then goes
// on in the background and asks for a reload when it ends, and its app
// comes back unavailable as being prepared. A preparation of the same
// version of an app, started before and still running or not yet used, is
// used instead of a new one; one of another version, or of an app no
// longer to prepare, is cancelled. An app whose preparation failed comes
// back unavailable with the error. When ctx ends first, the result means
// nothing: the caller must not serve it. Only the reload loop (and Run
// before it) calls it.
func (w *Worker) prepareApps(ctx context.Context, prev, loaded *app.Set) (*app.Set, map[string]*app.App) {
	w.prepareFailed = false
	p, ok := w.cfg.Runner.(Preparer)
	if !ok {
		return loaded, nil
	}
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
		if pr := w.preps[a.Name]; pr != nil {
			if sameApp(pr.app, a) {
				continue // running, or ended and not used yet
			}
			pr.cancel() // another version's: its result would not be used
		}
		pr := w.prepare(ctx, p, a)
		w.preps[a.Name] = pr
		started = append(started, pr)
	}
	for name, pr := range w.preps {
		if !wanted[name] {
			// The app was removed, broken, or edited back to the version
			// serving.
			pr.cancel()
			delete(w.preps, name)
			delete(w.waiting, name)
		}
	}
	w.waitPreparations(ctx, started, w.prepareWait(prev))
	if ctx.Err() != nil {
		return loaded, nil
	}
	apps := slices.Clone(loaded.List())
	replaced := false
	running := map[string]*app.App{}
	for i, a := range apps {
		pr := w.preps[a.Name]
		switch {
		case pr == nil:
			continue
		case pr.detach():
			apps[i] = withError(a, beingPrepared)
			running[a.Name] = a
		case pr.err != nil:
			delete(w.preps, a.Name)
			w.prepareFailed = true
			apps[i] = withError(a, notReady+pr.err.Error())
		default:
			delete(w.preps, a.Name)
			continue
		}
		replaced = true
	}
	if !replaced {
		return loaded, running
	}
	set, err := app.Loaded(apps)
	if err != nil {
		return loaded, running // the names are loaded's: unreachable
	}
	return set, running
}

// prepare starts preparing a in the background, bounded by ctx. When it
// ends after its load went on without it (detach), and was not cancelled,
// it asks for a reload, which uses its result.
func (w *Worker) prepare(ctx context.Context, p Preparer, a *app.App) *preparation {
	pctx, cancel := context.WithCancel(ctx)
	pr := &preparation{app: a, cancel: cancel, done: make(chan struct{})}
	w.preparing.Go(func() {
		defer cancel()
		err := p.Prepare(pctx, a.Name, a.Spec)
		if pctx.Err() != nil {
			// Stopping, or another version replaced this one: the error
			// says nothing about the app.
			err = pctx.Err()
		}
		reload := pr.finish(err)
		if reload && pctx.Err() == nil {
			w.Reload()
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
func (w *Worker) prepareWait(prev *app.Set) time.Duration {
	if prev == nil {
		return w.cfg.PrepareWait
	}
	return min(w.cfg.PrepareWait, maxReloadPrepareWait)
}

// waitPreparations waits until every preparation of prs ended, wait
// passed, or ctx ended.
func (w *Worker) waitPreparations(ctx context.Context, prs []*preparation, wait time.Duration) {
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
