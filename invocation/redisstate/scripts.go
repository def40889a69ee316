package redisstate

import (
	"embed"
	"regexp"
	"strings"

	"github.com/redis/rueidis"
)

// scriptFS holds every transition script (scripts/*.lua). Each file starts
// with a header listing its KEYS, ARGV and replies.
//
//go:embed scripts/*.lua
var scriptFS embed.FS

// scriptSources maps the name of every script a Go var uses to its source
// as written, without the helpers withHelpers puts in front.
// It is filled during package initialisation and read-only afterwards.
var scriptSources = map[string]string{}

// One script per Store method of the same name (settle.lua applies every
// transition after a claim). Only idempotent scripts are retryable
// (rueidis retries them on a broken connection, where the first run may
// already have applied).
var (
	claimScript       = script("claim.lua", rueidis.NewLuaScript)
	settleScript      = script("settle.lua", rueidis.NewLuaScript)
	pinScript         = script("pin.lua", rueidis.NewLuaScriptRetryable)
	retainAckedScript = script("retain_acked.lua", rueidis.NewLuaScriptRetryable)
	voidScript        = script("void.lua", rueidis.NewLuaScriptRetryable)
)

// helpers are the blocks of prelude.lua by name, in file order: the
// functions and patterns scripts share.
var helpers = splitHelpers(mustRead("prelude.lua"))

type helper struct{ name, src string }

// splitHelpers cuts prelude.lua at its lines that start with
// "-- helper: <name>".
func splitHelpers(prelude string) []helper {
	var out []helper
	for _, block := range strings.Split(prelude, "\n-- helper: ")[1:] {
		name, _, _ := strings.Cut(block, "\n")
		out = append(out, helper{name: strings.TrimSpace(name), src: "-- helper: " + block})
	}
	return out
}

// name matches a Lua name that is not a field (string.match, t:len), in
// its first group; comment matches a comment, whose names a script does
// not use.
var (
	name    = regexp.MustCompile(`(?:^|[^.:A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)`)
	comment = regexp.MustCompile(`--[^\n]*`)
)

// withHelpers returns src preceded by the helpers its code names (not its
// comments, nor a field such as string.match), directly or through
// another helper, in prelude order (a helper only uses earlier ones).
func withHelpers(src string) string {
	used := map[string]bool{}
	mark := func(text string) {
		for _, m := range name.FindAllStringSubmatch(comment.ReplaceAllString(text, ""), -1) {
			used[m[1]] = true
		}
	}
	mark(src)
	for i := len(helpers) - 1; i >= 0; i-- {
		if used[helpers[i].name] {
			mark(helpers[i].src)
		}
	}
	var b strings.Builder
	for _, h := range helpers {
		if used[h.name] {
			b.WriteString(h.src)
			b.WriteString("\n")
		}
	}
	b.WriteString(src)
	return b.String()
}

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
	return newScript(withHelpers(src))
}

// Reply codes of pin.lua, void.lua and retain_acked.lua: the first element
// of every reply. claim.lua and settle.lua use sets of their own (claim*,
// settle*).
const (
	codeApplied  = 1 // written
	codeTerminal = 3 // __terminal is set, or the message left the PEL: ErrTerminal
	codeAlready  = 4 // idempotent no-op (pin.lua, void.lua); has a TTL (retain_acked.lua)
	codePending  = 5 // the message is still pending (retain_acked.lua)
	codeMissing  = 6 // the hash does not exist (retain_acked.lua)
	codeNoGroup  = 7 // the stream or the group does not exist (retain_acked.lua)
)

// Reply codes of claim.lua, each with the length of its reply in
// claim.lua's flat array (claimReplyLen).
const (
	claimClaimed      = 1  // 1, attempt, deadline_ms, trace, lost
	claimRunning      = 2  // 2, deadline_ms, attempt
	claimNotDue       = 3  // 3, deadline_ms, attempts used
	claimSucceeded    = 4  // 4
	claimExhausted    = 5  // 5, attempt, token, trace, lost
	claimDeadLettered = 6  // 6, attempt, token, trace
	claimTerminal     = 7  // 7
	claimMalformed    = 8  // 8, value
	claimFirst        = 9  // 9, deadline_ms: attempt 1 claimed, trace '' and lost 0
	claimVoided       = 10 // 10: the claim was voided before it ran (void.lua)
	claimProbed       = 11 // 11, attempts used, lost: a probe recorded the field due
	claimThrottled    = 12 // 12, limit ('c' or 'r'), next_us: the gate's slots or rate defer it
	claimDebounced    = 13 // 13, due_ms: the gate's debounce period runs until due_ms
	claimSuperseded   = 14 // 14, newer message id: a newer event of its debounce key
	claimNotPending   = 15 // 15: the message is not in the group's PEL
)

// Reply codes of settle.lua, per settlement.
const (
	settleApplied  = 1 // 1, one element per transition
	settleStale    = 2
	settleTerminal = 3
	settlePending  = 5 // a Cleared settlement of a message still pending
)

// claimReplyLen returns how many elements, code included, the reply of
// code takes in claim.lua's flat array, or 0 for an unknown code.
func claimReplyLen(code int64) int {
	switch code {
	case claimSucceeded, claimTerminal, claimVoided, claimNotPending:
		return 1
	case claimMalformed, claimFirst, claimDebounced, claimSuperseded:
		return 2
	case claimRunning, claimNotDue, claimProbed, claimThrottled:
		return 3
	case claimDeadLettered:
		return 4
	case claimClaimed, claimExhausted:
		return 5
	}
	return 0
}
