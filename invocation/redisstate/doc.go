// Package redisstate keeps per-invocation retry state in Redis.
//
// It implements docs/delivery.md#invocation-state and the state side of
// docs/delivery.md#attempts-retries-backoff and
// docs/delivery.md#dead-letter-queue. Each message of a consumer group has
// one hash (internal/keys.Invocation) with one field per invocation,
// "<app>/<handler>", whose value is one of
// (docs/delivery.md#data-layout-in-redis):
//
//	running:<deadline_ms>:<attempt>:<token>          an attempt is executing
//	next_attempt_at:<deadline_ms>:<attempt>:<token>  attempt failed; retry from deadline
//	ok                                               succeeded
//	exhausted:<attempt>:<token>                      last attempt failed; DLQ entry pending
//	exhausted:<attempt>:<token>:dlq                  DLQ entry persisted
//	superseded:<message id>                          not run: a newer event of its
//	                                                 debounce group, that message,
//	                                                 was recorded
//
// The keys, leases, claims and settlements a Store takes and returns, their
// checks and the policy helpers are package invocation's, which links no
// Redis client.
//
// Fields starting with "__" are reserved and are not invocations:
// "__terminal" marks a retained hash, "__matched" says the first delivery
// recorded every invocation of the message (invocation.Record), "__schedule"
// is the pin of a schedule occurrence (Store.Pin), "__dlq:<app>/<handler>"
// holds the id of the invocation's dead-letter entry, written with it
// (invocation.DLQField), and "__trace:<app>/<handler>" holds the trace
// lineage of the invocation's latest unsuccessful attempt (a W3C traceparent,
// written by the Retry, Exhaust and Release transitions from Lease.Trace and
// returned by the next Claim as Claim.PrevTrace), so a retry on any worker
// can link its span to the attempt before it.
//
// Times are Unix milliseconds from the Redis server's TIME, so worker clock
// skew cannot change outcomes. attempt counts real handler executions. Claim
// (claim.lua) decides and records a batch of claims, passing each claim's
// flow-control gate (invocation.Gate: the relay:limit keys of
// docs/flow-control.md#how-it-is-enforced) first; Settle (settle.lua)
// applies a batch of settlements, each the transitions one delivery writes
// for one message (Finish, Retry, Exhaust, DeadLetter, Release) and, with
// Ack, its XACK and retention, all or nothing. Each script first checks the
// reserved field __terminal (once set, the hash is inert: Claim reports
// Terminal and a settlement returns invocation.ErrTerminal), then fences on
// attempt and token (invocation.ErrStale when they no longer match, so a
// stale owner never overwrites a newer claim), reads the server time, writes
// and returns. Nothing is read and then written from Go across round trips.
// Every transition also checks, in its script, that the message is still in
// its consumer group's PEL (a single-id XPENDING): once it left
// (acknowledged, or its reference cleared) a transition of a stale delivery
// is inert (Claim reports Terminal, the others invocation.ErrTerminal), with
// or without a hash, so no retained marker is needed for that. The hash has
// no TTL while the message is pending; only a settlement (with Ack, or
// Cleared) and, for a hash its message left the PEL without, RetainAcked
// apply the retention: delete the hash (retention 0) or set __terminal and
// the retention TTL.
//
// An expired running lease means its owner died or stalled mid-run. Claim
// counts that attempt as executed and failed: the next claim gets attempt+1,
// or, when that would exceed the caller's maximum number of attempts, the
// field becomes exhausted with the expired attempt and Claim returns
// Exhausted, so the handler is not run again. A live but slow owner that
// comes back after the takeover gets invocation.ErrStale. Release, by
// contrast, gives an attempt back uncharged (the app was unavailable, the
// worker is stopping). Finish is strictly fenced: it needs the running value
// of its own lease, and an "ok" already stored returns invocation.ErrStale,
// since "ok" carries no token.
//
// The package does not decide policy (package invocation has the helpers
// Backoff, DefaultBackoff, DefaultRetries and DefaultRetention): the caller
// compares attempts with the rule's retries, picks the backoff, and builds
// the DLQ entry (package dlq) that an Exhaust or DeadLetter transition writes
// to the stream's dead-letter stream in the same step as its ":dlq" marker.
// It does not read, ACK or reclaim stream entries apart from the XACK of
// Settle, and it deletes a hash only with retention 0: an un-retained hash is
// kept for as long as the message is pending, never expired early. A hash
// leaked by a crash between an XAUTOCLAIM that cleared its reference and the
// Cleared settlement (or an XACK from outside Settle) is found by
// RetainLeaked, a janitor step the caller runs now and then, which applies
// the retention once an atomic check shows its message is in no PEL of its
// group.
//
// A Store is safe for concurrent use, also by several workers sharing one
// Redis: each script runs atomically on the server.
package redisstate
