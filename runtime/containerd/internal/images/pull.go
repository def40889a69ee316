// Package images gets the images a Runner's containers run: found in the
// namespace, or pulled from their registry once for all concurrent
// callers, unpacked, and their configs remembered (docs/runtimes.md
// "Images").
package images

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	cimages "github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	clog "github.com/containerd/log"
	"github.com/distribution/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"
	logrusslog "github.com/sirupsen/logrus/hooks/slog"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
)

// Config is how a Store pulls images (the WithPull options).
type Config struct {
	Pull             bool          // pull an absent image; off: it is unavailable until imported
	Timeout          time.Duration // bounds one pull (resolve, download and unpack)
	RetryInterval    time.Duration // how long a failed pull is not tried again
	ProgressInterval time.Duration // period of the progress log line
}

// Store gets the images a Runner's containers need: present in the
// namespace, or pulled, and unpacked into the snapshotter, their configs
// read once (docs/runtimes.md "Images"). It is safe for concurrent use.
type Store struct {
	host  *core.Host
	cfg   Config
	pulls pulls
	facts imageFacts
}

// New returns the Store of host's namespace and snapshotter.
func New(host *core.Host, cfg Config) *Store {
	return &Store{host: host, cfg: cfg,
		pulls: pulls{inflight: map[string]*pullCall{}, failed: map[string]pullFailure{}, reported: map[string]pullReport{}}}
}

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

// Get returns image ref, pulling it when it is absent (Config.Pull),
// unpacked into the snapshotter. Its errors name the image; those of an
// image that is absent and cannot be had, and of an unreachable
// containerd, wrap runtime.ErrUnavailable and say what to do.
func (s *Store) Get(ctx context.Context, ref string) (client.Image, error) {
	img, err := s.host.Client.GetImage(ctx, ref)
	if errdefs.IsNotFound(err) {
		img, err = s.absentImage(ctx, ref)
	}
	if err != nil {
		return nil, core.Classify(fmt.Errorf("image %s: %w", ref, err))
	}
	if s.facts.unpacked(img) {
		s.imageReady(ctx, ref)
		return img, nil
	}
	unpacked, err := img.IsUnpacked(ctx, s.host.Snapshotter)
	if err != nil {
		return nil, core.Classify(fmt.Errorf("image %s: %w", ref, err))
	}
	if !unpacked {
		if err := img.Unpack(ctx, s.host.Snapshotter); err != nil {
			return nil, core.Classify(fmt.Errorf("unpack image %s into %s: %w", ref, s.host.Snapshotter, err))
		}
	}
	s.facts.markUnpacked(img)
	s.imageReady(ctx, ref)
	return img, nil
}

// imageReady logs "image ready" at INFO when ref is an image whose failed
// pull was reported ("image pull failed") and forgets the report: the
// image is present now, pulled or imported, and a later failure is
// reported anew. For any other image it does nothing but a map lookup.
func (s *Store) imageReady(ctx context.Context, ref string) {
	p := &s.pulls
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
	s.host.Logger.LogAttrs(ctx, slog.LevelInfo, "image ready", slog.String("image", norm),
		slog.String("namespace", s.host.Namespace), slog.Int("failed_pulls", rep.failures),
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
func (s *Store) pullFailed(ctx context.Context, ref string, err error) {
	msg := err.Error()
	p := &s.pulls
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
	s.host.Logger.LogAttrs(ctx, level, "image pull failed; tried again at the next rescan or run after retry_after",
		slog.String("image", ref), slog.String("namespace", s.host.Namespace), slog.String("error", msg),
		slog.Duration("retry_after", s.cfg.RetryInterval), slog.Int("failed_pulls", rep.failures))
}

// absentImage handles an image that is not stored under the name ref: it
// may be stored under its normalized name, else it is pulled (Config.Pull).
// Errors wrap runtime.ErrUnavailable and tell the operator what to do.
func (s *Store) absentImage(ctx context.Context, ref string) (client.Image, error) {
	norm, err := normalizeRef(ref)
	if err != nil {
		return nil, fmt.Errorf("invalid image reference (fix image: in template.yaml): %w: %w", err, runtime.ErrUnavailable)
	}
	if norm != ref {
		img, err := s.host.Client.GetImage(ctx, norm)
		if err == nil || !errdefs.IsNotFound(err) {
			return img, err
		}
	}
	if !s.cfg.Pull {
		return nil, fmt.Errorf("not found in containerd namespace %s and pulling is off; import it (scripts/images.sh, scripts/runtime-images.sh or ctr -n %s images import), or set image: in template.yaml to an image that is present: %w",
			s.host.Namespace, s.host.Namespace, runtime.ErrUnavailable)
	}
	return s.pullShared(ctx, norm)
}

// pullShared pulls ref once for all concurrent callers. A caller whose ctx
// ends stops waiting; the pull itself runs in the goroutine of the caller
// that started it and ends with that caller's ctx, after which a waiting
// caller starts a new one. A failed pull is reported to every Run needing
// ref, without a new attempt, for the retry interval.
func (s *Store) pullShared(ctx context.Context, ref string) (client.Image, error) {
	p := &s.pulls
	for {
		p.mu.Lock()
		if f, ok := p.failed[ref]; ok {
			if time.Since(f.at) < s.cfg.RetryInterval {
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

		call.img, call.err = s.pullImage(ctx, ref)
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
func (s *Store) pullImage(ctx context.Context, ref string) (client.Image, error) {
	level := slog.LevelInfo
	retry := s.pulls.reportedFailure(ref)
	if retry {
		level = slog.LevelDebug
	}
	pctx, cancel := context.WithTimeout(s.withClientLog(ctx, retry), s.cfg.Timeout)
	defer cancel()
	start := time.Now()
	s.host.Logger.LogAttrs(ctx, level, "pulling image", slog.String("image", ref), slog.String("namespace", s.host.Namespace))

	// The descriptors of this pull, seen before each is fetched, make the
	// progress figures.
	var mu sync.Mutex
	descs := map[string]ocispec.Descriptor{} // by digest
	record := cimages.HandlerFunc(func(_ context.Context, d ocispec.Descriptor) ([]ocispec.Descriptor, error) {
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
		t := time.NewTicker(s.cfg.ProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				done, total := s.pullProgress(pctx, snapshot())
				s.host.Logger.LogAttrs(ctx, slog.LevelInfo, "image pull progress", slog.String("image", ref),
					slog.Int64("bytes_done", done), slog.Int64("bytes_total", total),
					slog.Duration("elapsed", time.Since(start).Round(time.Millisecond)))
			}
		}
	})
	img, err := s.host.Client.Pull(pctx, ref,
		client.WithPullUnpack,
		client.WithPullSnapshotter(s.host.Snapshotter),
		client.WithImageHandler(record),
	)
	close(stop)
	wg.Wait()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("pull %s: %w", ref, ctx.Err())
		}
		if pctx.Err() != nil {
			err = fmt.Errorf("%w after %s (WithPullTimeout)", err, s.cfg.Timeout)
		}
		err = fmt.Errorf("not in containerd namespace %s, and pulling %s failed: %w; make its registry reachable, import the image (ctr -n %s images import ARCHIVE), or set image: in template.yaml to an image that is present: %w",
			s.host.Namespace, ref, err, s.host.Namespace, runtime.ErrUnavailable)
		s.pullFailed(ctx, ref, err)
		return nil, err
	}
	var size int64
	for _, d := range snapshot() {
		size += d.Size
	}
	s.host.Logger.LogAttrs(ctx, slog.LevelInfo, "image pulled", slog.String("image", ref),
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
func (s *Store) withClientLog(ctx context.Context, debug bool) context.Context {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetFormatter(discardFormatter{})
	var opts *logrusslog.HookOptions
	if debug {
		// logrus drops entries below its own level before any hook sees
		// them; Info (logrus.New's) keeps what it passed at the first pull.
		opts = &logrusslog.HookOptions{LevelMapper: func(logrus.Level) slog.Level { return slog.LevelDebug }}
	}
	l.AddHook(logrusslog.NewHook(s.host.Logger, opts))
	return clog.WithLogger(ctx, logrus.NewEntry(l))
}

// discardFormatter formats nothing: the hook writes the entry, through
// slog, and the logrus output is discarded.
type discardFormatter struct{}

func (discardFormatter) Format(*logrus.Entry) ([]byte, error) { return nil, nil }

// pullProgress returns how many bytes of descs are in the content store or
// being written to it, and their total size.
func (s *Store) pullProgress(ctx context.Context, descs map[string]ocispec.Descriptor) (done, total int64) {
	cs := s.host.Client.ContentStore()
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
