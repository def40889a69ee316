package console

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

// workersView is what the live workers of one stream publish
// (docs/delivery.md#worker-status), as the overview and the Pending page
// show it: why they hold messages, the attempts they run, their slots,
// what stalls and whether Redis lost the group.
type workersView struct {
	// Consumers are the workers that published their status.
	Consumers []string
	Holds     []holdView
	Runs      []runView
	Slots     []slotView
	// Waiting are the invocations the workers keep waiting for their
	// rules' flow control, by rule and limit (docs/flow-control.md#waiting).
	Waiting []waitingView
	// Stalls say what keeps the work from moving
	// (docs/console.md#in-an-outage); Lost counts the runs among Runs
	// whose message Redis no longer has pending.
	Stalls []stallView
	Lost   int
	// DataLoss says which workers created the consumer group again within
	// stats.RecreationShownFor.
	DataLoss []string
}

// runView is one attempt a worker runs now.
type runView struct {
	Consumer, App, Handler, MessageID string
	Attempt, MaxAttempts              int
	Started                           time.Time
	For                               time.Duration // how long it has run
	Timeout                           time.Duration
	LeaseUntil                        time.Time
	PastTimeout, Lost                 bool
	EventURL                          string // "" for a lost message: the stream may not hold it
}

// Target is "app/handler".
func (r runView) Target() string { return r.App + "/" + r.Handler }

// slotView is one app's slots on one worker.
type slotView struct {
	Consumer     string
	App          string
	InUse, Limit int
	Full         bool
	Lost         int // taken by attempts whose message is lost
	Global, Max  int // the worker's slots, all apps
	Oldest       time.Duration
	Holders      int // attempts of this stream among InUse
}

// waitingView is one rule's invocations waiting for one of its limits,
// summed over the workers.
type waitingView struct {
	App, Handler, Limit string
	Count               int
	Oldest              time.Duration // age of the oldest one's event; 0 unknown
}

// stallView is one line of the stall banner.
type stallView struct {
	Kind, Text string
}

// readWorkers reads the status the live workers of stream publish and
// turns it into what the pages show; pending is the stream's pending
// count, < 0 when unknown.
func (s *Server) readWorkers(ctx context.Context, rc rueidis.Client, stream string, pending int64) (workersView, error) {
	now := time.Now()
	ws, err := redisstats.ReadStatus(ctx, rc, stream, s.cfg.Group, now)
	if err != nil {
		return workersView{}, err
	}
	return s.workersOf(stream, ws, pending, now), nil
}

func (s *Server) workersOf(stream string, ws []stats.WorkerStatus, pending int64, now time.Time) workersView {
	v := workersView{Holds: holdViews(stream, stats.Holds(ws))}
	for _, w := range ws {
		v.Consumers = append(v.Consumers, clean(w.Consumer))
		for _, r := range w.Running {
			rv := runView{Consumer: clean(w.Consumer), App: clean(r.App), Handler: clean(r.Handler), MessageID: clean(r.MessageID),
				Attempt: r.Attempt, MaxAttempts: r.MaxAttempts, Started: r.Started, For: stats.Round(now.Sub(r.Started)),
				Timeout: r.Timeout(), LeaseUntil: r.LeaseUntil, PastTimeout: r.PastTimeout(now), Lost: r.Lost}
			if !r.Lost {
				rv.EventURL = query("/event", "stream", stream, "id", r.MessageID)
			} else {
				v.Lost++
			}
			v.Runs = append(v.Runs, rv)
		}
		if w.Slots == nil {
			continue
		}
		for _, a := range w.Slots.Apps {
			sv := slotView{Consumer: clean(w.Consumer), App: clean(a.App), InUse: a.InUse, Limit: a.Limit, Full: a.Full(),
				Global: w.Slots.InUse, Max: w.Slots.Max}
			for _, r := range w.Running {
				if r.App != a.App {
					continue
				}
				sv.Holders++
				sv.Oldest = max(sv.Oldest, stats.Round(now.Sub(r.Started)))
				if r.Lost {
					sv.Lost++
				}
			}
			if a.InUse == 0 && sv.Holders == 0 {
				continue // an app that ran here once and runs nothing now
			}
			v.Slots = append(v.Slots, sv)
		}
	}
	for _, w := range stats.SumWaiting(ws) {
		wv := waitingView{App: clean(w.App), Handler: clean(w.Handler), Limit: clean(w.Limit), Count: w.Count}
		if !w.Oldest.IsZero() {
			wv.Oldest = stats.Round(now.Sub(w.Oldest))
		}
		v.Waiting = append(v.Waiting, wv)
	}
	for _, st := range stats.Stalls(ws, pending, now) {
		v.Stalls = append(v.Stalls, stallView{Kind: st.Kind, Text: clean(st.String())})
	}
	for _, r := range stats.Recreations(ws, now) {
		v.DataLoss = append(v.DataLoss, clean(r.String(s.cfg.Group))+" ("+ago(r.At, now)+")")
	}
	return v
}

// run returns the attempt of app/handler field that a worker runs for
// message id, if any.
func (v workersView) run(id, field string) *runView {
	for i, r := range v.Runs {
		if r.MessageID == id && r.App+"/"+r.Handler == field {
			return &v.Runs[i]
		}
	}
	return nil
}

// full returns the full slots of app on consumer, nil when they are not
// full (or unknown).
func (v workersView) full(consumer, app string) *slotView {
	i := slices.IndexFunc(v.Slots, func(s slotView) bool { return s.Consumer == consumer && s.App == app && s.Full })
	if i < 0 {
		return nil
	}
	return &v.Slots[i]
}

// fullOn lists the apps whose slots are full on consumer.
func (v workersView) fullOn(consumer string) []slotView {
	var out []slotView
	for _, s := range v.Slots {
		if s.Consumer == consumer && s.Full {
			out = append(out, s)
		}
	}
	return out
}

// lostRuns are the runs whose message Redis no longer has pending.
func (v workersView) lostRuns() []runView {
	var out []runView
	for _, r := range v.Runs {
		if r.Lost {
			out = append(out, r)
		}
	}
	return out
}

// Workers names the workers that publish their status, for a line that
// says the group has no consumer while they run.
func (v workersView) Workers() string { return strings.Join(v.Consumers, ", ") }
