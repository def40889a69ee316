// Package relaytest provides in-memory fakes of Relay's replaceable parts
// and the shared contract suites that every implementation of them must
// pass.
//
// The fakes let a service unit-test its handlers end to end, through a real
// relay.Engine, without Redis or containers:
//
//   - Stream is a Redis Stream with one consumer group; Stream.Consumer
//     returns a relay.StreamSource (also a relay.GroupEnsurer,
//     relay.PendingReporter, relay.OwnerChecker and relay.Pinger) for one
//     consumer of it.
//   - StateStore is a relay.StateStore with the semantics of
//     invocation.Store: claims with leases and fencing tokens, ErrStale and
//     ErrTerminal, exhaustion when the last attempt's lease expired,
//     terminal retention with a TTL; and a relay.ClaimVoider, which gives
//     back a claim whose reply was lost (docs/delivery.md#lost-replies).
//   - Settler pairs a Consumer with a StateStore as invocation.Store pairs
//     with a stream.Source on one Redis: a relay.Settler and
//     relay.BatchSettler whose settlements are atomic, so an Engine on the
//     fakes takes the path it takes on Redis, and a wrapper of a Settler
//     can be tested without Redis.
//   - DLQ is a relay.DLQWriter that keeps its entries, with the reading side
//     of dlq.Store (List, Get, Delete, Len); WithPending fences its writes
//     by the PEL as a Worker's dlq.Writer is.
//   - Runner is a relay.Runner that records requests and answers with
//     scripted outcomes; runtime.Func runs real Go handlers instead.
//
// Consumer has every optional capability of stream.Source, and StateStore
// that of invocation.Store (relay.ClaimVoider), so an Engine on them takes
// the paths it takes on Redis.
//
// Time in Stream, StateStore and DLQ comes from a Clock (WithClock): the
// system clock by default, or a ManualClock a test steps by hand. All fakes
// work inside a testing/synctest bubble, where the system clock is the
// bubble's, so an Engine with its default timings (1m backoff, 1m
// MinPendingIdle) runs a test in microseconds of real time.
//
// The contract suites TestStateStore, TestStreamSource, TestDLQWriter,
// TestRunner and TestMatcher state what relay.go,
// docs/apps.md#the-handler-contract and docs/delivery.md (from
// docs/delivery.md#from-entry-to-acknowledgement through
// docs/delivery.md#concurrency-and-heartbeat) require of an
// implementation, from the interface's point of view. They run against
// the fakes in this package's tests, and in the tests of the real
// implementations against them: invocation.Store, stream.Source and
// dlq.Writer on a real redis-server, runtime.Func, runtime.Process and the
// containerd runner, and the matcher of app.Set. Run them against your
// own implementation too. A fake is trusted only because it passes the
// same suite as the real thing. Each suite takes a harness constructor,
// called once per parallel sub-test; the harness gives the suite what the
// interface cannot, such as control over the implementation's clock
// (AdvanceManual for a ManualClock, AdvanceByPolling for a Redis server's
// TIME).
//
// Every fake is safe for concurrent use. They are meant for tests: state
// lives in memory, is never evicted except by a retention TTL, and is lost
// with the value.
package relaytest
