package console

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// streamView is one stream of the overview.
type streamView struct {
	Name string
	// Problem says what could not be read (the stream or group is missing,
	// Redis failed); the rest is then partly empty.
	Problem string
	// Read says which figures were read: a figure that was not is shown
	// as unknown, never as 0 (with Redis down, "0 pending" would be a lie).
	Read   readFigures
	Length int64
	// Lag is the group's entries not delivered yet; LagKnown is false
	// when Redis cannot tell (after a deletion in the stream).
	Lag           int64
	LagKnown      bool
	LastDelivered string
	Pending       int64
	OldestPending time.Duration
	Consumers     []consumerView
	DLQ           int64
	Counters      []counterView
	Sampled       time.Duration // the span the sparklines cover
	Samples       int
	RateSpan      time.Duration // the span the rates per minute cover
	// Holds say why the live workers hold messages of the stream; Workers
	// is all that they publish (the attempts they run, their slots, what
	// stalls, whether Redis lost the group).
	Holds   []holdView
	Workers workersView
	// Memory is the Redis memory by part and its projection; nil when the
	// stream could not be read.
	Memory *memoryView
}

// readFigures says which of a stream's figures the overview read.
type readFigures struct {
	Length, Pending, DLQ, Consumers, Counters bool
}

type consumerView struct {
	Name     string
	Pending  int64
	Idle     time.Duration
	Inactive time.Duration // since its last successful read; -1 unknown
}

type overviewView struct {
	Now      time.Time
	Streams  []streamView
	Interval time.Duration
	Window   time.Duration
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	v := overviewView{Now: time.Now(), Interval: s.cfg.SampleInterval, Window: s.cfg.SampleWindow}
	for _, st := range s.cfg.Streams {
		v.Streams = append(v.Streams, s.streamOverview(r.Context(), st))
	}
	s.render(w, r, "overview", "Overview", v)
}

// streamOverview reads what the overview shows of one stream: XINFO
// GROUPS and CONSUMERS, the PEL summary (as relay stats), the DLQ length
// and the counters. What it cannot read stays unknown (Read).
func (s *Server) streamOverview(ctx context.Context, name string) streamView {
	v := streamView{Name: name}
	rc := s.redis(ctx)
	b := rc.B()
	res := rc.DoMulti(ctx,
		b.Xlen().Key(name).Build(),
		b.XinfoGroups().Key(name).Build(),
		b.XinfoConsumers().Key(name).Group(s.cfg.Group).Build(),
	)
	if s.readGroup(&v, res[0], res[1]) {
		v.Consumers, v.Read.Consumers = consumers(res[2])
		s.readQueues(ctx, rc, &v)
		mem := s.streamMemory(ctx, rc, name, v)
		v.Memory = &mem
	} else {
		// What was measured before is no longer what Redis holds.
		s.forgetMemory(name)
	}
	c, err := redisstats.Read(ctx, rc, name, s.cfg.Group)
	if err != nil {
		if v.Problem == "" {
			v.Problem = "reading the counters failed: " + err.Error()
		}
	} else {
		v.Read.Counters = true
	}
	v.Counters = s.counterViews(name, c)
	pending := int64(-1)
	if v.Read.Pending {
		pending = v.Pending
	}
	if v.Workers, err = s.readWorkers(ctx, rc, name, pending); err != nil && v.Problem == "" {
		v.Problem = "reading the workers' status failed: " + err.Error()
	}
	v.Holds = v.Workers.Holds
	if sm := s.sampler.get(name); len(sm) > 0 {
		v.Samples, v.Sampled, v.RateSpan = len(sm), sm[len(sm)-1].at.Sub(sm[0].at), rateSpan(sm)
	}
	return v
}

// readGroup reads the stream's length and its group's lag from the
// replies of XLEN and XINFO GROUPS; false when the rest cannot be read
// (v.Problem says why).
func (s *Server) readGroup(v *streamView, xlen, groups rueidis.RedisResult) bool {
	n, err := xlen.AsInt64()
	if err != nil {
		v.Problem = "reading the stream failed: " + err.Error()
		return false
	}
	v.Length, v.Read.Length = n, true
	gs, err := groups.ToArray()
	if err != nil {
		if rueidis.IsRedisNil(err) || isNoSuchKey(err) {
			v.Problem = "the stream does not exist yet (a worker's first start creates it)"
		} else {
			v.Problem = "XINFO GROUPS failed: " + err.Error()
		}
		return false
	}
	for _, g := range gs {
		m, err := g.AsMap()
		if err != nil {
			continue
		}
		if gn, _ := field(m, "name").ToString(); gn != s.cfg.Group {
			continue
		}
		if lag, err := field(m, "lag").AsInt64(); err == nil {
			v.Lag, v.LagKnown = lag, true
		}
		v.LastDelivered, _ = field(m, "last-delivered-id").ToString()
		return true
	}
	v.Problem = "consumer group " + s.cfg.Group + " does not exist on this stream (a worker's first start creates it)"
	return false
}

// consumers reads the reply of XINFO CONSUMERS, sorted by name; false
// when it is an error.
func consumers(res rueidis.RedisResult) ([]consumerView, bool) {
	cs, err := res.ToArray()
	if err != nil {
		return nil, false
	}
	var out []consumerView
	for _, c := range cs {
		m, err := c.AsMap()
		if err != nil {
			continue
		}
		cv := consumerView{Inactive: -1}
		cv.Name, _ = field(m, "name").ToString()
		cv.Name = clean(cv.Name)
		cv.Pending, _ = field(m, "pending").AsInt64()
		idle, _ := field(m, "idle").AsInt64()
		cv.Idle = time.Duration(idle) * time.Millisecond
		if in, err := field(m, "inactive").AsInt64(); err == nil && in >= 0 {
			cv.Inactive = time.Duration(in) * time.Millisecond
		}
		out = append(out, cv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, true
}

// readQueues reads the PEL summary and the DLQ length.
func (s *Server) readQueues(ctx context.Context, rc rueidis.Client, v *streamView) {
	var err error
	v.Pending, v.OldestPending, err = redisstream.New(rc, v.Name, s.cfg.Group, "relay-console").Pending(ctx)
	if err != nil && !errors.Is(err, stream.ErrNoGroup) {
		v.Problem = "XPENDING failed: " + err.Error()
	} else {
		v.Read.Pending = true
	}
	if v.DLQ, err = redisdlq.NewStore(rc, v.Name).Len(ctx); err != nil {
		v.Problem = "reading the dead-letter queue failed: " + err.Error()
	} else {
		v.Read.DLQ = true
	}
}

func isNoSuchKey(err error) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re) && (re.IsNil() || containsFold(re.Error(), "no such key"))
}

// field returns m[k] addressable, or a nil message when absent.
func field(m map[string]rueidis.RedisMessage, k string) *rueidis.RedisMessage {
	v, ok := m[k]
	if !ok {
		return &rueidis.RedisMessage{}
	}
	return &v
}
