// Package redisstats keeps the cluster-wide delivery counters of one stream
// and consumer group in Redis, the numbers relay stats shows
// (docs/delivery.md#cluster-wide-counters), a sampled feed of recent
// invocation outcomes that relay console tails, each worker's status (why
// it holds messages pending, the attempts it runs, its slots and whether it
// created the consumer group again: WriteStatus, ReadStatus, ReadHolds;
// docs/delivery.md#held-messages, docs/delivery.md#worker-status), and the
// memory measurement a projection starts from (MeasureMemory;
// docs/operations.md#redis-memory).
//
// Every worker counts in memory (Recorder.Add never waits for Redis or
// fails) and adds its counts to one hash every second (Recorder.Flush);
// Read returns the sums. Like the Prometheus counters they count
// deliveries and attempts, so a redelivered message is received again. The
// hash is a wire contract: its field names do not change.
//
// The values it reads and writes (stats.Counts, stats.Event,
// stats.WorkerStatus, stats.Memory, ...) and what is computed from them
// (stats.Holds, stats.Stalls, the memory projection) are package stats',
// which links no Redis client.
//
// A Recorder is safe for concurrent use; the package starts no goroutines.
// It never closes the client it is given.
package redisstats
