package redisschedule

import (
	"embed"

	"github.com/redis/rueidis"
)

// scriptFS holds the Redis scripts (scripts/*.lua). Each file starts with a
// header listing its KEYS, ARGV and replies.
//
//go:embed scripts/*.lua
var scriptFS embed.FS

// publishScript is run by Publisher.Publish. It is not registered as
// retryable: a retry after a lost reply would report a duplicate instead of
// the publish that happened, and Publish has its own retry policy.
var publishScript = rueidis.NewLuaScript(mustRead("publish.lua"))

// Reply codes of publish.lua: the first element of its reply.
const (
	codeDuplicate = 0
	codePublished = 1
)

func mustRead(name string) string {
	src, err := scriptFS.ReadFile("scripts/" + name)
	if err != nil {
		panic("schedule: missing embedded script " + name)
	}
	return string(src)
}
