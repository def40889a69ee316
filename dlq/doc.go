// Package dlq is the dead-letter queue's data: the Entry one exhausted
// invocation or malformed message leaves, its wire format (Encode,
// EncodePairs, Decode, Entry.Validate), the filters and pages a reader asks
// for (Filter, PageQuery, Page), replay histories (Replays), retention
// (DefaultRetention, Entry.Expires, TrimResult) and its errors.
//
// The queue is the stream relay:<stream>:dlq
// (docs/delivery.md#dead-letter-queue,
// docs/delivery.md#data-layout-in-redis), one entry per exhausted invocation
// and one per malformed message. The Redis implementation, the Writer that
// appends and trims entries and the Store that lists, gets, deletes and
// pages them (relay dlq ls / inspect / rm), is package dlq/redisdlq. This
// package links no Redis client, so the engine (package relay) builds its
// entries without one.
package dlq
