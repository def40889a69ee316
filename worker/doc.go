// Package worker runs what one relay start process runs, on Redis
// (docs/embedding.md#worker): a relay.Engine per stream over the Redis
// parts it assembles (redisstream, redisstate, redisdlq, redisstats;
// streams.go), the Scheduler of the apps' schedules (schedules.go), and
// the services that keep them, each a small type with its own settings,
// metrics and Run:
//
//	reloader.go  loads the apps, and on every change swaps the next
//	             generation in: nextGeneration decides what serves,
//	             Worker.serve (worker.go) hands it to the Engines and the
//	             schedules (docs/apps.md#changing-apps)
//	prepare.go   the preparations of apps (relay.Preparer) a load waits for
//	retainer.go  trims each stream and its dead-letter stream, removes idle
//	             consumers (docs/operations.md#retention)
//	janitor.go   retains invocation state leaked without a TTL
//	sweeper.go   removes the Runner's leftovers (relay.Sweeper)
//	policy.go    warns when Redis may evict keys
//	             (docs/operations.md#redis-memory)
//	startup.go   waits for a Redis that does not answer yet at start
//	             (Connect, Config.StartupWait;
//	             docs/embedding.md#starting-before-redis)
//
// The Worker reaches the Engines through their exported methods only.
package worker
