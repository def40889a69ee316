package containerd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	clog "github.com/containerd/log"
	"github.com/distribution/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"
	logrusslog "github.com/sirupsen/logrus/hooks/slog"

	"github.com/relaydev/relay/runtime"
)

// pulls deduplicates concurrent pulls of one image, remembers failures
// for the retry interval, and remembers which failures were logged, so an
// image that stays absent is reported once (docs/runtimes.md "Images").
type pulls struct {
	mu       sync.Mutex
	inflight map[string]*pullCall
	failed   map[string]pullFailure
	// reported holds, by normalized reference, the images whose pull
	// failure was logged at WARN and that have not been ready since.
	reported map[string]pullReport
}

// pullReport is the failure of an image's pulls that was logged at WARN.
type pullReport struct {
	err      string    // the error logged
	since    time.Time // the first failed pull
	failures int       // failed pulls since, the first included
}

type pullCall struct {
	done chan struct{} // closed when the fields below are set
	img  client.Image
	err  error
	// abandoned: the pulling caller's ctx ended, which says nothing about
	// the registry.
	abandoned bool
}

type pullFailure struct {
	err error
	at  time.Time
}

// normalizeRef returns ref in the fully qualified form that containerd
// stores and pulls: "python:3.12-slim" is docker.io/library/python:3.12-slim,
// a reference without tag gets ":latest". References that already name a
// registry ("relay.local/busybox:latest") are unchanged.
func normalizeRef(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", err
	}
	return named.String(), nil
}

// image returns image ref, pulling it when it is absent (WithPull), unpacked
// into the snapshotter.
func (r *Runner) image(ctx context.Context, ref string) (client.Image, error) {
	img, err := r.client.GetImage(ctx, ref)
	if errdefs.IsNotFound(err) {
		img, err = r.absentImage(ctx, ref)
	}
	if err != nil {
		return nil, classify(fmt.Errorf("image %s: %w", ref, err))
	}
	if r.images.unpacked(img) {
		r.imageReady(ctx, ref)
		return img, nil
	}
	unpacked, err := img.IsUnpacked(ctx, r.snapshotter)
	if err != nil {
		return nil, classify(fmt.Errorf("image %s: %w", ref, err))
	}
	if !unpacked {
		if err := img.Unpack(ctx, r.snapshotter); err != nil {
			return nil, classify(fmt.Errorf("unpack image %s into %s: %w", ref, r.snapshotter, err))
		}
	}
	r.images.markUnpacked(img)
	r.imageReady(ctx, ref)
	return img, nil
}

// imageReady logs "image ready" at INFO when ref is an image whose failed
// pull was reported ("image pull failed") and forgets the report: the
// image is present now, pulled or imported, and a later failure is
// reported anew. For any other image it does nothing but a map lookup.
func (r *Runner) imageReady(ctx context.Context, ref string) {
	p := &r.pulls
	p.mu.Lock()
	if len(p.reported) == 0 {
		p.mu.Unlock()
		return
	}
	norm, err := normalizeRef(ref)
	if err != nil {
		norm = ref
	}
	rep, ok := p.reported[norm]
	delete(p.reported, norm)
	p.mu.Unlock()
	if !ok {
		return
	}
	r.logger.LogAttrs(ctx, slog.LevelInfo, "image ready", slog.String("image", norm),
		slog.String("namespace", r.namespace), slog.Int("failed_pulls", rep.failures),
		slog.Duration("unavailable_for", time.Since(rep.since).Round(time.Second)))
}

// reportedFailure reports whether a failed pull of ref was logged at WARN
// and ref has not been ready since: the next attempt then logs at DEBUG.
func (p *pulls) reportedFailure(ref string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.reported[ref]
	return ok
}

// pullFailed logs the failed pull of ref: at WARN the first time, or when
// the error differs from the one logged last, with the error (which says
// what to do) and when the pull is tried again; at DEBUG when it repeats
// the failure logged.
func (r *Runner) pullFailed(ctx context.Context, ref string, err error) {
	msg := err.Error()
	p := &r.pulls
	p.mu.Lock()
	rep, ok := p.reported[ref]
	level := slog.LevelDebug
	if !ok || rep.err != msg {
		level = slog.LevelWarn
		if !ok {
			rep.since = time.Now()
		}
		rep.err = msg
	}
	rep.failures++
	p.reported[ref] = rep
	p.mu.Unlock()
	r.logger.LogAttrs(ctx, level, "image pull failed; tried again at the next rescan or run after retry_after",
		slog.String("image", ref), slog.String("namespace", r.namespace), slog.String("error", msg),
		slog.Duration("retry_after", r.pullRetryInterval), slog.Int("failed_pulls", rep.failures))
}

// absentImage handles an image that is not stored under the name ref: it
// may be stored under its normalized name, else it is pulled (WithPull).
// Errors wrap runtime.ErrUnavailable and tell the operator what to do.
func (r *Runner) absentImage(ctx context.Context, ref string) (client.Image, error) {
	norm, err := normalizeRef(ref)
	if err != nil {
		return nil, fmt.Errorf("invalid image reference (fix image: in template.yaml): %w: %w", err, runtime.ErrUnavailable)
	}
	if norm != ref {
		img, err := r.client.GetImage(ctx, norm)
		if err == nil || !errdefs.IsNotFound(err) {
			return img, err
		}
	}
	if !r.pull {
		return nil, fmt.Errorf("not found in containerd namespace %s and pulling is off; import it (scripts/images.sh, scripts/runtime-images.sh or ctr -n %s images import), or set image: in template.yaml to an image that is present: %w",
			r.namespace, r.namespace, runtime.ErrUnavailable)
	}
	return r.pullShared(ctx, norm)
}

// pullShared pulls ref once for all concurrent callers. A caller whose ctx
// ends stops waiting; the pull itself runs in the goroutine of the caller
// that started it and ends with that caller's ctx, after which a waiting
// caller starts a new one. A failed pull is reported to every Run needing
// ref, without a new attempt, for the retry interval.
func (r *Runner) pullShared(ctx context.Context, ref string) (client.Image, error) {
	p := &r.pulls
	for {
		p.mu.Lock()
		if f, ok := p.failed[ref]; ok {
			if time.Since(f.at) < r.pullRetryInterval {
				p.mu.Unlock()
				return nil, f.err
			}
			delete(p.failed, ref)
		}
		if call, ok := p.inflight[ref]; ok {
			p.mu.Unlock()
			select {
			case <-call.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if call.abandoned && ctx.Err() == nil {
				continue // the puller went away, not the registry: pull ourselves
			}
			return call.img, call.err
		}
		call := &pullCall{done: make(chan struct{})}
		p.inflight[ref] = call
		p.mu.Unlock()

		call.img, call.err = r.pullImage(ctx, ref)
		call.abandoned = ctx.Err() != nil
		p.mu.Lock()
		delete(p.inflight, ref)
		if call.err != nil && !call.abandoned {
			p.failed[ref] = pullFailure{err: call.err, at: time.Now()}
		}
		p.mu.Unlock()
		close(call.done)
		return call.img, call.err
	}
}

// pullImage pulls and unpacks ref, logging its start, its progress every
// pull progress interval and its end, or its failure (pullFailed). When
// it tries again after a failure that was reported, its start and what
// containerd's client logs are at DEBUG: the operator was told, and the
// same lines at every rescan would hide the ones that matter.
func (r *Runner) pullImage(ctx context.Context, ref string) (client.Image, error) {
	level := slog.LevelInfo
	retry := r.pulls.reportedFailure(ref)
	if retry {
		level = slog.LevelDebug
	}
	pctx, cancel := context.WithTimeout(r.withClientLog(ctx, retry), r.pullTimeout)
	defer cancel()
	start := time.Now()
	r.logger.LogAttrs(ctx, level, "pulling image", slog.String("image", ref), slog.String("namespace", r.namespace))

	// The descriptors of this pull, seen before each is fetched, make the
	// progress figures.
	var mu sync.Mutex
	descs := map[string]ocispec.Descriptor{} // by digest
	record := images.HandlerFunc(func(_ context.Context, d ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		mu.Lock()
		descs[d.Digest.String()] = d
		mu.Unlock()
		return nil, nil
	})
	snapshot := func() map[string]ocispec.Descriptor {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(descs)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.pullProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				done, total := r.pullProgress(pctx, snapshot())
				r.logger.LogAttrs(ctx, slog.LevelInfo, "image pull progress", slog.String("image", ref),
					slog.Int64("bytes_done", done), slog.Int64("bytes_total", total),
					slog.Duration("elapsed", time.Since(start).Round(time.Millisecond)))
			}
		}
	})
	img, err := r.client.Pull(pctx, ref,
		client.WithPullUnpack,
		client.WithPullSnapshotter(r.snapshotter),
		client.WithImageHandler(record),
	)
	close(stop)
	wg.Wait()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("pull %s: %w", ref, ctx.Err())
		}
		if pctx.Err() != nil {
			err = fmt.Errorf("%w after %s (WithPullTimeout)", err, r.pullTimeout)
		}
		err = fmt.Errorf("not in containerd namespace %s, and pulling %s failed: %w; make its registry reachable, import the image (ctr -n %s images import ARCHIVE), or set image: in template.yaml to an image that is present: %w",
			r.namespace, ref, err, r.namespace, runtime.ErrUnavailable)
		r.pullFailed(ctx, ref, err)
		return nil, err
	}
	var size int64
	for _, d := range snapshot() {
		size += d.Size
	}
	r.logger.LogAttrs(ctx, slog.LevelInfo, "image pulled", slog.String("image", ref),
		slog.Int64("bytes", size), slog.Duration("duration", time.Since(start).Round(time.Millisecond)))
	return img, nil
}

// withClientLog returns ctx with a logger for what containerd's client
// code logs on its own (through logrus: a registry host that failed, say),
// which sends it to the Runner's logger: otherwise it goes to standard
// error in logrus's format, a line that is not JSON among LOG_FORMAT=json
// output (docs/operations.md "Logs"). With debug, every line is at DEBUG
// whatever its level in containerd: a retry's "fetch failed" repeats a
// failure already reported.
func (r *Runner) withClientLog(ctx context.Context, debug bool) context.Context {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetFormatter(discardFormatter{})
	var opts *logrusslog.HookOptions
	if debug {
		// logrus drops entries below its own level before any hook sees
		// them; Info (logrus.New's) keeps what it passed at the first pull.
		opts = &logrusslog.HookOptions{LevelMapper: func(logrus.Level) slog.Level { return slog.LevelDebug }}
	}
	l.AddHook(logrusslog.NewHook(r.logger, opts))
	return clog.WithLogger(ctx, logrus.NewEntry(l))
}

// discardFormatter formats nothing: the hook writes the entry, through
// slog, and the logrus output is discarded.
type discardFormatter struct{}

func (discardFormatter) Format(*logrus.Entry) ([]byte, error) { return nil, nil }

// pullProgress returns how many bytes of descs are in the content store or
// being written to it, and their total size.
func (r *Runner) pullProgress(ctx context.Context, descs map[string]ocispec.Descriptor) (done, total int64) {
	cs := r.client.ContentStore()
	active := map[string]int64{}
	if statuses, err := cs.ListStatuses(ctx); err == nil {
		for _, st := range statuses {
			active[st.Expected.String()] = st.Offset
		}
	}
	for key, d := range descs {
		total += d.Size
		if off, ok := active[key]; ok {
			done += off
		} else if _, err := cs.Info(ctx, d.Digest); err == nil {
			done += d.Size
		}
	}
	return done, total
}
