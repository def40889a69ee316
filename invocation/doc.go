// Package invocation defines per-invocation retry state: the Key of a
// message's state, what a relay.StateStore takes and returns (ClaimRequest,
// Claim, Lease, Settlement, Transition and their results), their checks
// (ClaimRequest.Check, Settlement.Check, Lease.Check, CheckClaim,
// CheckRecord, CheckField, CheckToken, CheckRetention), the errors that
// fence a transition (ErrStale, ErrTerminal, ClaimUnknownError) and the
// policy helpers Backoff, DefaultBackoff, DefaultRetries and
// DefaultRetention (docs/delivery.md#invocation-state,
// docs/delivery.md#attempts-retries-backoff).
//
// Each message of a consumer group has one hash (internal/keys.Invocation)
// with one field per invocation, Field(app, handler), whose value is one of
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
// Fields starting with "__" are reserved and are not invocations: TraceField
// and DLQField name two of them. UnfinishedOf reads what is not final from
// a copy of the hash.
//
// The Redis implementation, a Store whose every transition is one Lua
// script run atomically on the server, is package invocation/redisstate.
// This package links no Redis client, so the engine (package relay) and
// other StateStores (relaytest's) use its types without one.
package invocation
