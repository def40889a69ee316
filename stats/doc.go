// Package stats is the data of the cluster-wide delivery counters of one
// stream and consumer group (Counts, Counter;
// docs/delivery.md#cluster-wide-counters), of the feed of recent invocation
// outcomes (Event), of each worker's status (WorkerStatus: its holds, the
// attempts it runs, its slots; docs/delivery.md#held-messages,
// docs/delivery.md#worker-status) and of the Redis memory of a stream
// (Memory), with what is computed from them: the holds of all workers
// (Holds), what stalls the stream (Stalls, Recreations) and the memory
// projection against a budget (Memory.Project, Pressure, Blame, Verdict;
// docs/operations.md#redis-memory).
//
// The Redis implementation, the Recorder that counts and flushes, the
// feed, the status hash and MeasureMemory, is package stats/redisstats.
// This package links no Redis client, so the engine (package relay) uses
// its types without one.
package stats
