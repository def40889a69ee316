package console

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

// sample is the cluster counters of one stream at one time.
type sample struct {
	at     time.Time
	counts stats.Counts
}

// sampler keeps, per stream, the counters read over the last window, in
// memory: the console's rates start empty when it starts and need two
// samples.
type sampler struct {
	mu      sync.Mutex
	window  time.Duration
	max     int
	samples map[string][]sample
}

func newSampler(streams []string, window, interval time.Duration) *sampler {
	s := &sampler{window: window, max: int(window/interval) + 2, samples: map[string][]sample{}}
	for _, st := range streams {
		s.samples[st] = nil
	}
	return s
}

func (s *sampler) add(stream string, at time.Time, c stats.Counts) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := append(s.samples[stream], sample{at, c})
	// Keep one sample at or before the window's start, so the rate covers
	// the whole window.
	cut := 0
	for cut+1 < len(l) && !l[cut+1].at.After(at.Add(-s.window)) {
		cut++
	}
	l = l[cut:]
	if len(l) > s.max {
		l = l[len(l)-s.max:]
	}
	s.samples[stream] = l
}

func (s *sampler) get(stream string) []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.samples[stream]...)
}

// sampleOnce reads every stream's counters once.
func (s *Server) sampleOnce(ctx context.Context) {
	for _, st := range s.cfg.Streams {
		c, err := redisstats.Read(ctx, s.redis(ctx), st, s.cfg.Group)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("console: reading the counters failed; the rates skip this sample", "stream", st, "error", err)
			}
			continue
		}
		s.sampler.add(st, time.Now(), c)
	}
}

// counterView is one counter of the overview: its total, its current
// rate and a sparkline of its per-interval increments over the window.
type counterView struct {
	Name  string
	Class string // "bad" for failures and dead letters, for colour
	Total int64
	// PerMin is the rate over the newest rateSamples intervals (the
	// current rate, not the window's average); Rated is false with fewer
	// than two samples.
	PerMin float64
	Rated  bool
	Spark  spark
}

// rateSamples is how many of the newest sample intervals the current
// rate spans: a minute at the default interval, so a burst that ended
// leaves the rate within a minute.
const rateSamples = 6

// increase is how much a counter rose from prev to cur. A counter lower
// than before was reset (Redis lost its data, or the hash was deleted)
// and counted again from 0, so it rose by cur: never a negative rate.
func increase(prev, cur int64) int64 {
	if cur < prev {
		return cur
	}
	return cur - prev
}

// rateSpan is the time the current rate spans: the newest rateSamples
// intervals of samples, or all of them when there are fewer.
func rateSpan(samples []sample) time.Duration {
	if len(samples) < 2 {
		return 0
	}
	first := max(len(samples)-1-rateSamples, 0)
	return samples[len(samples)-1].at.Sub(samples[first].at)
}

// spark is an inline SVG sparkline: a polyline in a 0..sparkW × 0..sparkH
// box.
type spark struct {
	Points string
	Max    int64 // the largest increment drawn, for the title
	Empty  bool
}

const (
	sparkW = 120
	sparkH = 24
)

// counterViews builds the overview's counters of stream from the latest
// counts and the samples.
func (s *Server) counterViews(stream string, now stats.Counts) []counterView {
	samples := s.sampler.get(stream)
	type def struct {
		name, class string
		get         func(stats.Counts) int64
	}
	defs := []def{
		{"received", "", func(c stats.Counts) int64 { return c.Received }},
		{"matched", "", func(c stats.Counts) int64 { return c.Matched }},
		{"unmatched", "", func(c stats.Counts) int64 { return c.Unmatched }},
		{"malformed", "bad", func(c stats.Counts) int64 { return c.Malformed }},
		{"succeeded", "good", func(c stats.Counts) int64 { return c.Successes }},
		{"failed", "bad", func(c stats.Counts) int64 { return c.Failures }},
		{"dead-lettered", "bad", func(c stats.Counts) int64 { return c.DLQEntries }},
		{"replayed", "good", func(c stats.Counts) int64 { return c.Replays }},
		{"replay failed", "bad", func(c stats.Counts) int64 { return c.ReplayFailures }},
	}
	out := make([]counterView, 0, len(defs))
	span := rateSpan(samples)
	for _, d := range defs {
		v := counterView{Name: d.name, Class: d.class, Total: d.get(now)}
		vals := make([]int64, 0, len(samples))
		for i := 1; i < len(samples); i++ {
			vals = append(vals, increase(d.get(samples[i-1].counts), d.get(samples[i].counts)))
		}
		if span > 0 {
			var rose int64
			for _, n := range vals[max(len(vals)-rateSamples, 0):] {
				rose += n
			}
			v.PerMin, v.Rated = float64(rose)/span.Minutes(), true
		}
		v.Spark = sparkline(vals)
		out = append(out, v)
	}
	return out
}

// sparkline draws vals (at least two) left to right, scaled to the
// largest; fewer is an empty sparkline.
func sparkline(vals []int64) spark {
	if len(vals) < 2 {
		return spark{Empty: true}
	}
	var top int64 = 1
	for _, v := range vals {
		top = max(top, v)
	}
	var b strings.Builder
	for i, v := range vals {
		x := float64(i) * sparkW / float64(len(vals)-1)
		y := sparkH - 1 - float64(v)*(sparkH-2)/float64(top)
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(x, 'f', 1, 64) + "," + strconv.FormatFloat(y, 'f', 1, 64))
	}
	m := top
	if m == 1 {
		m = 0
		for _, v := range vals {
			m = max(m, v)
		}
	}
	return spark{Points: b.String(), Max: m}
}
