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
//     redisstate.Store: batched claims with leases and fencing tokens, and
//     probes; settlements applied whole or not at all, with ErrStale and
//     ErrTerminal; exhaustion when the last attempt's lease expired;
//     terminal retention with a TTL; and a relay.ClaimVoider, which gives
//     back a claim whose reply was lost (docs/delivery.md#lost-replies).
//     Given the Stream (WithStream) and a DLQ (WithDLQ), as
//     redisstate.Store shares one Redis with redisstream.Source, its Settle
//     acknowledges on the Stream and writes dead-letter entries into the
//     DLQ in the same step as their markers, so an Engine on the fakes
//     takes the path it takes on Redis.
//   - DLQ is a dead-letter queue: the DLQ a StateStore writes into, a
//     DLQWriter (Write appends an entry outside any delivery, as
//     redisdlq.Writer does) and the reading side of redisdlq.Store (List, Get,
//     Delete, Len: a DLQReader).
//   - Runner is a relay.Runner that records requests and answers with
//     scripted outcomes; runtime.Func runs real Go handlers instead.
//
// Consumer has every optional capability of redisstream.Source, and StateStore
// that of redisstate.Store (relay.ClaimVoider), so an Engine on them takes
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
// implementation, from the interface's point of view:
//
//   - TestStateStore: claims, probes and records; every transition of a
//     Settlement and its fencing (ErrStale); dead-letter entries written
//     once, with their marker and their id in invocation.DLQField;
//     settlements atomic per message; the Ack, its retention (retention 0
//     deletes the state), a Stateless ack and a Cleared settlement;
//     inertness once a message left the PEL (ErrTerminal, Terminal);
//     rewound messages; pins, trace lineage and Void.
//   - TestStreamSource: reads, reclaims (deleted entries included) and
//     heartbeats, which return the ids no longer pending; the PEL left by
//     acknowledged entries; the optional PendingReporter, OwnerChecker and
//     Pinger.
//   - TestDLQWriter: a dead-letter queue's DLQWriter and DLQReader:
//     validation, defaults, ordering, the reading side.
//   - TestRunner and TestMatcher: relay.Runner and relay.Matcher.
//
// They run against the fakes in this package's tests, and in the tests of
// the real implementations against them: redisstate.Store, redisstream.Source
// and redisdlq.Writer with redisdlq.Store on a real redis-server, runtime.Func,
// runtime.Process and the containerd runner, and the matcher of app.Set.
// Run them against your own implementation too. A fake is trusted only
// because it passes the same suite as the real thing. Each suite takes a
// harness constructor, called once per parallel sub-test; the harness
// gives the suite what the interface cannot, such as control over the
// implementation's clock (AdvanceManual for a ManualClock,
// AdvanceByPolling for a Redis server's TIME), a view of the stream's PEL
// or of the dead-letter queue.
//
// Every fake is safe for concurrent use. They are meant for tests: state
// lives in memory, is never evicted except by a retention TTL, and is lost
// with the value.
package relaytest
