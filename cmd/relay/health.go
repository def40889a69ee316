package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/plural"
	"github.com/relaydev/relay/internal/redisinfo"
	"github.com/relaydev/relay/internal/reltime"
	"github.com/relaydev/relay/internal/textsafe"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// HealthCmd is `relay health`.
type HealthCmd struct {
	RunnerFlags    `embed:""`
	RetentionFlags `embed:""`
	JSON           bool          `name:"json" help:"Print JSON instead of a table."`
	WaitingAge     time.Duration `name:"waiting-age" default:"15m" help:"Warn when an invocation waiting for its rule's flow control (concurrency, rate, debounce) has an event older than this: the waiting grows faster than the limit lets it drain (docs/flow-control.md#waiting)."`
}

// Help shows examples under relay health --help.
func (c *HealthCmd) Help() string {
	return `Checks that Redis answers and the stream and consumer group exist, and that containerd answers and its namespace can be used (skipped with --runner process), that no worker holds messages pending for an app it cannot serve (a template or pattern error, a missing image or secret), and that every template of the apps root is valid, as relay validate checks them, whether or not a worker runs (the default root /apps only when it exists). It warns (WARN, exit 0) when a worker runs a handler past its timeout or for a message Redis no longer has pending, when an app's slots are stuck full while messages wait (docs/operations.md#stalled-handlers), when a worker created the consumer group again in the last hour: Redis lost its data (docs/operations.md#redis-lost-its-data), and when a rule has an invocation waiting for its flow control with an event older than --waiting-age (docs/flow-control.md#waiting). The memory budget check fails when the Redis memory, projected at the current event rate with the retentions given (set them as the workers have them), or the memory in use now, is over 90% of maxmemory (docs/operations.md#memory-budget). Exits 1 naming each failing part.

Examples:

    relay health
    relay health --json`
}

type healthCheckJSON struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// Warning marks a check that passed with a risk an operator should
	// fix (a Redis that may evict keys).
	Warning bool `json:"warning,omitempty"`
	// Skipped marks a check that was not made (its part is not in use, or
	// what it reads is unreachable): it does not fail the health, and it
	// does not pass either, so it is not shown as ok.
	Skipped bool `json:"skipped,omitempty"`
}

type healthJSON struct {
	Healthy bool              `json:"healthy"`
	Checks  []healthCheckJSON `json:"checks"`
}

// Run runs every check, prints one row each and fails naming the failed ones.
func (c *HealthCmd) Run(ctx context.Context, g *Globals) error {
	if err := g.requireStream(true); err != nil {
		return err
	}
	if err := c.RetentionFlags.check(); err != nil {
		return err
	}
	// One client for every Redis check; once Redis is found unreachable
	// (refused, or not answering within pingTimeout) the checks that read
	// it are skipped rather than each waiting out its own timeout.
	rc, dialErr := g.redisClient()
	if dialErr == nil {
		defer rc.Close()
	}
	redisCheck, reachable := c.checkRedis(ctx, g, rc, dialErr)
	if !reachable {
		rc = nil
	}
	checks := []healthCheckJSON{redisCheck, c.checkAccess(ctx, g, rc), c.checkMemory(ctx, rc), c.checkBudget(ctx, g, rc), c.checkContainerd(ctx, g), c.checkHolds(ctx, g, rc), checkApps(g)}
	checks = append(checks, c.checkWorkers(ctx, g, rc)...)
	var failing []string
	for _, ch := range checks {
		if !ch.OK {
			failing = append(failing, ch.Name)
		}
	}
	if c.JSON {
		if err := writeJSON(g.stdout, healthJSON{Healthy: len(failing) == 0, Checks: checks}); err != nil {
			return err
		}
	} else {
		rows := make([][]string, 0, len(checks))
		for _, ch := range checks {
			status := "ok"
			switch {
			case !ch.OK:
				status = "FAIL"
			case ch.Warning:
				status = "WARN"
			case ch.Skipped:
				status = "skipped"
			}
			rows = append(rows, []string{ch.Name, status, strings.Join(strings.Fields(ch.Detail), " ")})
		}
		if err := table(g.stdout, []string{"CHECK", "STATUS", "DETAIL"}, rows); err != nil {
			return err
		}
	}
	if len(failing) > 0 {
		return fmt.Errorf("unhealthy: %s", strings.Join(failing, ", "))
	}
	return nil
}

// checkRedis checks that Redis answers on rc (dialErr: the client could
// not be made) and that the stream and group exist. reachable is false
// when Redis did not answer, so the other Redis checks are not made.
func (c *HealthCmd) checkRedis(ctx context.Context, g *Globals, rc rueidis.Client, dialErr error) (ch healthCheckJSON, reachable bool) {
	ch = healthCheckJSON{Name: "redis"}
	if err := dialErr; err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			ch.Detail = err.Error()
			return ch, false
		}
		if authHint(err) != "" {
			ch.Detail = fmt.Sprintf("%s refused the login: %v", redactURI(g.RedisURI), errors.Unwrap(err))
			return ch, false
		}
		ch.Detail = fmt.Sprintf("%s is unreachable: %v", redactURI(g.RedisURI), errors.Unwrap(err))
		return ch, false
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	err := redisstream.New(rc, g.RedisStream, g.RedisGroup, "relay-health").Ping(pctx)
	reachable = err == nil || errors.Is(err, stream.ErrNoStream) || errors.Is(err, stream.ErrNoGroup)
	switch {
	case errors.Is(err, stream.ErrNoStream):
		ch.Detail = fmt.Sprintf("stream %q does not exist on %s: check REDIS_STREAM (a worker's first start creates it)", g.RedisStream, redactURI(g.RedisURI))
	case errors.Is(err, stream.ErrNoGroup):
		ch.Detail = fmt.Sprintf("consumer group %q does not exist on stream %q: check REDIS_GROUP (a worker's first start creates it)", g.RedisGroup, g.RedisStream)
	case err != nil:
		ch.Detail = fmt.Sprintf("%s: %v", redactURI(g.RedisURI), err)
	default:
		ch.OK = true
		ch.Detail = fmt.Sprintf("%s, stream %s, group %s", redactURI(g.RedisURI), g.RedisStream, g.RedisGroup)
	}
	return ch, reachable
}

// checkAccess fails when the Redis user may not run what a worker needs on
// the stream's keys (docs/deployment.md#connecting-to-redis): a worker
// would read its messages and then fail every claim, leaving them pending.
func (c *HealthCmd) checkAccess(ctx context.Context, g *Globals, rc rueidis.Client) healthCheckJSON {
	ch := healthCheckJSON{Name: "redis access"}
	if !redisToCheck(rc, &ch) {
		return ch
	}
	if rc.Mode() == rueidis.ClientModeCluster {
		// The probe is one script over the stream's keys: they must share
		// its slot, or the client refuses to send it.
		if _, err := keys.CheckClusterLayout([]string{g.RedisStream}, g.RedisGroup); err != nil {
			ch.Detail = err.Error()
			return ch
		}
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	err := redisinfo.Access(pctx, rc, keys.StreamAndDerived(g.RedisStream, g.RedisGroup))
	if err != nil {
		ch.Detail = fmt.Sprintf("%v; grant the user the ACL rules of docs/deployment.md (ACL users)", err)
		return ch
	}
	ch.OK = true
	ch.Detail = "scripts, TIME and the keys of stream " + g.RedisStream + " are allowed"
	return ch
}

// checkMemory warns when a Redis server may evict keys
// (docs/operations.md#redis-memory): eviction can drop invocation state,
// dedup keys or the stream itself. A server that does not tell is not a
// failure.
func (c *HealthCmd) checkMemory(ctx context.Context, rc rueidis.Client) healthCheckJSON {
	ch := healthCheckJSON{Name: "redis memory", OK: true}
	if !redisToCheck(rc, &ch) {
		return ch
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	mems, err := redisinfo.MemoryPolicies(pctx, rc)
	if err != nil {
		ch.Warning = true
		ch.Detail = fmt.Sprintf("cannot read maxmemory-policy (%v); make sure it is noeviction", err)
		return ch
	}
	var evicting []string
	for _, m := range mems {
		if m.Evicts() {
			evicting = append(evicting, fmt.Sprintf("%s has maxmemory-policy %s: Redis may evict %s", m.Addr, m.Policy, m.MayEvict()))
		}
	}
	if len(evicting) > 0 {
		ch.Warning = true
		ch.Detail = strings.Join(evicting, "; ") + "; set maxmemory-policy noeviction"
		return ch
	}
	ch.Detail = "maxmemory-policy noeviction"
	return ch
}

// checkHolds fails when a live worker holds messages pending that only an
// operator can release (docs/delivery.md#held-messages): an app whose
// rules cannot be read holds every message of the stream, an unavailable
// app holds its invocations. It reads the status the workers publish.
func (c *HealthCmd) checkHolds(ctx context.Context, g *Globals, rc rueidis.Client) healthCheckJSON {
	ch := healthCheckJSON{Name: "held messages"}
	if !redisToCheck(rc, &ch) {
		return ch
	}
	rctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	workers, err := redisstats.ReadStatus(rctx, rc, g.RedisStream, g.RedisGroup, time.Now())
	switch {
	case err != nil:
		ch.OK, ch.Skipped = true, true
		ch.Detail = "not checked: " + err.Error()
		return ch
	case len(workers) == 0:
		ch.OK, ch.Skipped = true, true
		ch.Detail = fmt.Sprintf("not checked: no worker of group %s published its status in the last %s", g.RedisGroup, stats.StatusStaleAfter)
		return ch
	}
	holds := stats.Holds(workers)
	if len(holds) == 0 {
		ch.OK = true
		ch.Detail = fmt.Sprintf("%d workers report no held message", len(workers))
		if len(workers) == 1 {
			ch.Detail = "1 worker reports no held message"
		}
		return ch
	}
	lines := make([]string, len(holds))
	for i, h := range holds {
		lines[i] = h.String()
	}
	ch.Detail = strings.Join(lines, "; ")
	return ch
}

// checkApps loads the apps root as relay validate does and fails naming
// each unavailable app with its first error, whether or not a worker runs
// (docs/operations.md#commands): a worker would serve none of its
// handlers, and an app whose rules cannot be read holds every message of
// the stream. The default root is checked only when it exists.
func checkApps(g *Globals) healthCheckJSON {
	ch := healthCheckJSON{Name: "apps"}
	apps, err := g.loadApps()
	switch {
	case errors.Is(err, fs.ErrNotExist) && !g.appsSet:
		ch.OK, ch.Skipped = true, true
		ch.Detail = fmt.Sprintf("not checked: no apps root at %s; set RELAY_APPS (--apps) to the workers' to check their templates", g.Apps)
		return ch
	case err != nil:
		ch.Detail = err.Error()
		return ch
	case len(apps.List()) == 0:
		ch.Detail = errNoApps(g.Apps).Error()
		return ch
	}
	var bad []string
	for _, a := range apps.List() {
		if a.Available() {
			continue
		}
		what := "unavailable: its messages stay pending"
		if a.Incomplete {
			what = "unavailable, its rules unreadable: every message of the stream stays pending"
		}
		more := ""
		if n := len(a.Errors) - 1; n > 0 {
			more = fmt.Sprintf(" (and %s; relay validate lists them)", plural.Of(n, "more error"))
		}
		bad = append(bad, fmt.Sprintf("%s %s: %s%s", a.Name, what, textsafe.Escape(a.Errors[0].Error(), false), more))
	}
	if len(bad) > 0 {
		ch.Detail = strings.Join(bad, "; ")
		return ch
	}
	ch.OK = true
	ch.Detail = fmt.Sprintf("%s in %s, every template valid", plural.Of(len(apps.List()), "app"), g.Apps)
	return ch
}

// checkWorkers warns about what the live workers publish
// (docs/operations.md#stalled-handlers): "running handlers" names every
// attempt past its timeout or running for a message Redis lost, and every
// app whose slots are stuck full while messages wait; "redis data" names
// every worker that created the consumer group again within
// stats.RecreationShownFor (docs/operations.md#redis-lost-its-data). Both
// only warn: the workers go on, and the operator decides.
func (c *HealthCmd) checkWorkers(ctx context.Context, g *Globals, rc rueidis.Client) []healthCheckJSON {
	runs, data := healthCheckJSON{Name: "running handlers", OK: true}, healthCheckJSON{Name: "redis data", OK: true}
	waits := healthCheckJSON{Name: "flow control", OK: true}
	if rc == nil {
		redisToCheck(rc, &runs)
		redisToCheck(rc, &data)
		redisToCheck(rc, &waits)
		return []healthCheckJSON{runs, data, waits}
	}
	rctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	now := time.Now()
	workers, err := redisstats.ReadStatus(rctx, rc, g.RedisStream, g.RedisGroup, now)
	switch {
	case err != nil:
		runs.Skipped, data.Skipped, waits.Skipped = true, true, true
		runs.Detail = "not checked: " + err.Error()
		data.Detail, waits.Detail = runs.Detail, runs.Detail
		return []healthCheckJSON{runs, data, waits}
	case len(workers) == 0:
		runs.Skipped, data.Skipped, waits.Skipped = true, true, true
		runs.Detail = fmt.Sprintf("not checked: no worker of group %s published its status in the last %s", g.RedisGroup, stats.StatusStaleAfter)
		data.Detail, waits.Detail = runs.Detail, runs.Detail
		return []healthCheckJSON{runs, data, waits}
	}
	waits = c.checkWaiting(workers, now)
	pending, _, err := redisstream.New(rc, g.RedisStream, g.RedisGroup, "relay-health").Pending(rctx)
	if err != nil {
		pending = -1 // full slots are not judged
	}
	var lines []string
	n := 0
	for _, w := range workers {
		n += len(w.Running)
	}
	for _, st := range stats.Stalls(workers, pending, now) {
		lines = append(lines, st.String())
	}
	if len(lines) > 0 {
		runs.Warning, runs.Detail = true, strings.Join(lines, "; ")
	} else {
		runs.Detail = fmt.Sprintf("%s on %s, none past its timeout or for a lost message", plural.Of(n, "handler attempt"), plural.Of(len(workers), "worker"))
	}
	lines = lines[:0]
	for _, r := range stats.Recreations(workers, now) {
		lines = append(lines, r.String(g.RedisGroup)+"; check why Redis lost its data and publish again what the producers still have")
	}
	if len(lines) > 0 {
		data.Warning, data.Detail = true, strings.Join(lines, "; ")
	} else {
		data.Detail = fmt.Sprintf("no worker created consumer group %s again in the last %s", g.RedisGroup, strings.TrimSuffix(stats.RecreationShownFor.String(), "0m0s"))
	}
	return []healthCheckJSON{runs, data, waits}
}

// checkWaiting warns about every rule whose invocations wait for its flow
// control with an event older than --waiting-age: a limit that lets fewer
// through than arrive keeps the oldest waiting ever older, until max_age
// (if set) dead-letters them (docs/flow-control.md#waiting).
func (c *HealthCmd) checkWaiting(workers []stats.WorkerStatus, now time.Time) healthCheckJSON {
	ch := healthCheckJSON{Name: "flow control", OK: true}
	waiting := stats.SumWaiting(workers)
	var lines []string
	n := 0
	for _, w := range waiting {
		n += w.Count
		if !w.Oldest.IsZero() && now.Sub(w.Oldest) > c.WaitingAge {
			lines = append(lines, fmt.Sprintf("%s/%s: %s waiting for its %s limit, the oldest event %s old (over --waiting-age %s): the limit drains them slower than they arrive; raise it, or set max_age to give up on stale events",
				w.App, w.Handler, plural.Of(w.Count, "invocation"), w.Limit, reltime.Age(now.Sub(w.Oldest)), c.WaitingAge))
		}
	}
	if len(lines) > 0 {
		ch.Warning, ch.Detail = true, strings.Join(lines, "; ")
		return ch
	}
	ch.Detail = fmt.Sprintf("%s waiting for flow control, none with an event older than %s", plural.Of(n, "invocation"), c.WaitingAge)
	return ch
}

// redisToCheck reports whether check ch can read Redis through rc, or
// marks ch skipped (Redis is unreachable: the redis check fails for it)
// when rc is nil.
func redisToCheck(rc rueidis.Client, ch *healthCheckJSON) bool {
	if rc == nil {
		ch.OK, ch.Skipped = true, true
		ch.Detail = "not checked: Redis is unreachable (see the redis check)"
		return false
	}
	return true
}

func (c *HealthCmd) checkContainerd(ctx context.Context, g *Globals) healthCheckJSON {
	ch := healthCheckJSON{Name: "containerd"}
	if c.Runner == "process" {
		ch.OK, ch.Skipped = true, true
		ch.Detail = "not checked: the process runner is in use"
		return ch
	}
	// Opening the runner is the check: it pings containerd and the namespace.
	r, err := c.open(ctx, g.logger(), io.Discard, io.Discard, cliHostID())
	if err != nil {
		// Ping marks its errors runtime.ErrUnavailable, which reads oddly here.
		ch.Detail = strings.ReplaceAll(err.Error(), runtime.ErrUnavailable.Error()+": ", "")
		return ch
	}
	r.Close()
	ch.OK = true
	ch.Detail = fmt.Sprintf("%s, namespace %s", c.ContainerdAddress, c.ContainerdNamespace)
	return ch
}

// checkBudget fails when the stream's Redis memory, projected at the
// current event rate with the retentions, exceeds 90% of maxmemory
// (docs/operations.md#redis-memory): at maxmemory the workers fail closed.
func (c *HealthCmd) checkBudget(ctx context.Context, g *Globals, rc rueidis.Client) healthCheckJSON {
	ch := healthCheckJSON{Name: "memory budget"}
	if !redisToCheck(rc, &ch) {
		return ch
	}
	mctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	m, err := c.measureMemory(mctx, rc, g)
	if err != nil {
		ch.OK, ch.Skipped = true, true
		ch.Detail = "not checked: " + err.Error()
		return ch
	}
	ch.OK = !m.Pressure(stats.BudgetShare)
	ch.Detail = memoryView{m: m, r: c.retentions()}.verdict()
	return ch
}
