package relay

import (
	"context"
	"strings"
	"sync"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
)

// Preparer is an optional Runner capability: Prepare readies what an app
// needs before its handlers run, such as its dependency image
// (docs/runtimes.md#dependencies) and its secrets (docs/apps.md#secrets),
// and waits for it. A Worker calls it for every app that has either, at
// start and whenever a reload finds the app new or changed; an error makes
// the app unavailable with the error as its reason, so its messages stay
// pending, and on a reload the app's previous version keeps serving. Safe
// for concurrent use.
type Preparer interface {
	Prepare(ctx context.Context, app string, spec runtime.Spec) error
}

// needsPreparing reports whether a has something a Preparer readies.
func needsPreparing(a *app.App) bool {
	return a.Spec.Deps != nil || len(a.Spec.Secrets) > 0
}

// prepareApps prepares, concurrently, each available app of loaded that
// needs it and is not served unchanged and available in prev (nil at
// start); an app that fails gets the error in its Errors. When ctx ends
// first, an app whose preparation was cut short has no error: the caller
// must not serve loaded then.
func (w *Worker) prepareApps(ctx context.Context, prev, loaded *app.Set) {
	p, ok := w.cfg.Runner.(Preparer)
	if !ok {
		return
	}
	var wg sync.WaitGroup
	for _, a := range loaded.List() {
		if !a.Available() || !needsPreparing(a) {
			continue
		}
		if prev != nil {
			if old := prev.Get(a.Name); old != nil && old.Available() && sameApp(old, a) {
				continue
			}
		}
		wg.Go(func() {
			if err := p.Prepare(ctx, a.Name, a.Spec); err != nil && ctx.Err() == nil {
				// Logged with the app's other errors (logApps, reload).
				a.Errors.Add(a.File, 0, 0, "", notReady+err.Error())
			}
		})
	}
	wg.Wait()
}

// notReady starts the error a failed preparation adds to an app.
const notReady = "app not ready: "

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
