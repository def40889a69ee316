package redisstate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/invocation"
)

// BenchmarkScriptCost measures the Redis server time of the scripts on the
// path of a message whose one invocation succeeds at its first attempt,
// apart from the worker and the network: the claims of a read's messages
// in one Claim batch (claim.lua), and their settlement, a Finish and the
// Ack of each, in one Settle batch (settle.lua). It reports
// the server's µs per claim and per settlement (INFO commandstats), which
// depend much less on the load of a shared machine than the pipeline's
// figures do (bench/RESULTS.md, section 4.7).
//
//	go test -run '^$' -bench ScriptCost -benchtime 500x ./invocation/redisstate
func BenchmarkScriptCost(b *testing.B) {
	for _, retention := range []time.Duration{48 * time.Hour, 0} {
		b.Run("retention="+retention.String(), func(b *testing.B) {
			const perRead = 8 // an Engine's MAX_CONCURRENCY default
			srv := redistest.Start(b, redistest.Options{})
			c := redistest.Connect(b, srv.Addr)
			s := New(c)
			ctx := context.Background()
			stream, group := "bench", "g"
			if err := c.Do(ctx, c.B().XgroupCreate().Key(stream).Group(group).Id("0").Mkstream().Build()).Error(); err != nil {
				b.Fatal(err)
			}
			var claimUS, settleUS int64
			var claimRuns, settleRuns int
			reqs := make([]invocation.ClaimRequest, perRead)
			ss := make([]invocation.Settlement, perRead)
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				cmds := make(rueidis.Commands, 0, perRead+1)
				for j := range perRead {
					cmds = append(cmds, c.B().Xadd().Key(stream).Id(fmt.Sprintf("%d-%d", i+1, j)).FieldValue().FieldValue("event", "{}").Build())
				}
				cmds = append(cmds, c.B().Xreadgroup().Group(group, "c").Count(perRead).Streams().Key(stream).Id(">").Build())
				for _, r := range c.DoMulti(ctx, cmds...) {
					if err := r.Error(); err != nil {
						b.Fatal(err)
					}
				}
				runs0, us0 := scriptStats(b, c)
				b.StartTimer()

				for j := range perRead {
					reqs[j] = invocation.ClaimRequest{Key: invocation.Key{Stream: stream, Group: group, MessageID: fmt.Sprintf("%d-%d", i+1, j)},
						Field: "app/handler", Lease: time.Minute, MaxAttempts: 3, Record: invocation.Record{Complete: true}}
				}
				claims := s.Claim(ctx, reqs)
				b.StopTimer()
				runs1, us1 := scriptStats(b, c)
				b.StartTimer()
				for j, cl := range claims {
					if cl.Err == nil && cl.Status != invocation.Claimed {
						cl.Err = fmt.Errorf("claim of a fresh message: status %v", cl.Status)
					}
					if cl.Err != nil {
						b.Fatalf("claim %d: %v", j, cl.Err)
					}
					ss[j] = invocation.Settlement{Key: cl.Lease.Key, Transitions: []invocation.Transition{{Kind: invocation.Finish, Lease: cl.Lease}}, Ack: true, Retention: retention}
				}
				for j, r := range s.Settle(ctx, ss) {
					if r.Err != nil {
						b.Fatalf("settle %d: %v", j, r.Err)
					}
				}
				b.StopTimer()
				runs2, us2 := scriptStats(b, c)
				b.StartTimer()
				claimUS, claimRuns = claimUS+us1-us0, claimRuns+runs1-runs0
				settleUS, settleRuns = settleUS+us2-us1, settleRuns+runs2-runs1
			}
			n := float64(b.N * perRead)
			b.ReportMetric(float64(claimUS)/n, "redis-µs/claim")
			b.ReportMetric(float64(settleUS)/n, "redis-µs/settle")
			b.ReportMetric(float64(claimRuns)/float64(b.N), "claim-runs/read")
			b.ReportMetric(float64(settleRuns)/float64(b.N), "settle-runs/read")
		})
	}
}
