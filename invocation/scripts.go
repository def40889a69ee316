package invocation

import (
	"embed"

	"github.com/redis/rueidis"
)

// scriptFS holds every transition script (scripts/*.lua). Each file starts
// with a header listing its KEYS, ARGV and replies.
//
//go:embed scripts/*.lua
var scriptFS embed.FS

// scriptSources maps the name of every script a Go var uses to its source.
// It is filled during package initialisation and read-only afterwards.
var scriptSources = map[string]string{}

// One script per state transition, run by the Store method of the same name.
// Only idempotent scripts are retryable (rueidis retries them on a broken
// connection, where the first run may already have applied).
var (
	claimScript         = script("claim.lua", rueidis.NewLuaScript)
	releaseScript       = script("release.lua", rueidis.NewLuaScript)
	finishScript        = script("finish.lua", rueidis.NewLuaScript)
	scheduleRetryScript = script("schedule_retry.lua", rueidis.NewLuaScript)
	exhaustScript       = script("exhaust.lua", rueidis.NewLuaScript)
	markDLQScript       = script("mark_dlq.lua", rueidis.NewLuaScriptRetryable)
	retainScript        = script("retain.lua", rueidis.NewLuaScriptRetryable)
	pinScript           = script("pin.lua", rueidis.NewLuaScriptRetryable)
	retainAckedScript   = script("retain_acked.lua", rueidis.NewLuaScriptRetryable)
)

// prelude holds the helpers every script may call (fence, now_ms,
// retain); it is prepended to each script's source.
var prelude = mustRead("prelude.lua")

func mustRead(name string) string {
	src, err := scriptFS.ReadFile("scripts/" + name)
	if err != nil {
		panic("invocation: missing embedded script " + name)
	}
	return string(src)
}

func script(name string, newScript func(string, ...rueidis.LuaOption) *rueidis.Lua) *rueidis.Lua {
	src := mustRead(name)
	scriptSources[name] = src
	return newScript(prelude + "\n" + src)
}

// Reply codes of the transition scripts: the first element of every reply.
// claim.lua uses its own set (claim*); the others share these.
const (
	codeApplied  = 1 // the transition was written
	codeStale    = 2 // attempt or token did not match: ErrStale
	codeTerminal = 3 // __terminal is set: ErrTerminal
	codeAlready  = 4 // idempotent no-op (mark_dlq.lua, retain.lua); has a TTL (retain_acked.lua)
	codePending  = 5 // the message is still pending (retain_acked.lua)
	codeMissing  = 6 // the hash does not exist (retain_acked.lua)
	codeNoGroup  = 7 // the stream or the group does not exist (retain_acked.lua)
)

// Reply codes of claim.lua.
const (
	claimClaimed      = 1 // {1, attempt, deadline_ms}
	claimRunning      = 2 // {2, deadline_ms}
	claimNotDue       = 3 // {3, deadline_ms}
	claimSucceeded    = 4 // {4}
	claimExhausted    = 5 // {5, attempt, token}
	claimDeadLettered = 6 // {6, attempt, token}
	claimTerminal     = 7 // {7}
	claimMalformed    = 8 // {8, value}
)
