package keys

import (
	"testing"
	"time"
)

// The strings are a wire contract (DESIGN.md); changing one breaks other tools.
func TestKeys(t *testing.T) {
	at := time.Date(2026, 3, 8, 7, 0, 0, 500, time.FixedZone("x", 3600))
	for _, c := range []struct{ got, want string }{
		{Invocation("events", "workers", "1700000000000-0"), "relay:invocation:events:workers:1700000000000-0"},
		{Invocation("a:b", "g%1", "1-0"), "relay:invocation:a%3Ab:g%251:1-0"},
		{DLQ("events"), "relay:events:dlq"},
		{DLQWritten("{orders}", "relay", "1-0", "billing", "a.b"), "relay:{orders}:dlq:written:relay:1-0:billing/a.b"},
		{ScheduleOccurrence("events", "billing", "nightly", at), "relay:schedule:billing:nightly:2026-03-08T06:00:00Z"},
		{ScheduleOccurrence("{orders}.in", "billing", "nightly", at), "relay:schedule:{orders}:billing:nightly:2026-03-08T06:00:00Z"},
		{Stats("events", "workers"), "relay:stats:events:workers"},
		{InvocationPattern("{orders}", "relay"), "relay:invocation:{orders}:relay:*"},
		{InvocationPattern(`a*b?[c]\d`, "g:1"), `relay:invocation:a\*b\?\[c\]\\d:g%3A1:*`},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestHashTag(t *testing.T) {
	for _, c := range []struct {
		key, tag string
		ok       bool
	}{
		{"{orders}", "orders", true},
		{"x{a}{b}", "a", true},
		{"{}orders", "", false},
		{"orders{", "", false},
		{"orders", "", false},
		{"a}{b}", "b", true},
	} {
		tag, ok := HashTag(c.key)
		if tag != c.tag || ok != c.ok {
			t.Errorf("HashTag(%q) = %q, %v; want %q, %v", c.key, tag, ok, c.tag, c.ok)
		}
	}
}

func TestInvocationMessageID(t *testing.T) {
	for _, c := range []struct {
		key, id string
		ok      bool
	}{
		{Invocation("{orders}", "relay", "1700000000000-0"), "1700000000000-0", true},
		{Invocation("{orders}", "relay", ""), "", false},
		{Invocation("{orders}", "other", "1-0"), "", false},
		{Invocation("{orders}", "relay:x", "1-0"), "", false}, // another group, "relay%3Ax"
		{Invocation("{orders}", "relay", "1-0") + ":x", "", false},
		{"relay:invocation:{orders}:relay:1%3A0", "", false}, // not built by Invocation
		{Stats("{orders}", "relay"), "", false},
	} {
		id, ok := InvocationMessageID("{orders}", "relay", c.key)
		if id != c.id || ok != c.ok {
			t.Errorf("InvocationMessageID(%q) = %q, %v; want %q, %v", c.key, id, ok, c.id, c.ok)
		}
	}
}
