package keys

import (
	"strings"
	"testing"
	"time"
)

// The strings are a wire contract (docs/delivery.md#data-layout-in-redis);
// changing one breaks other tools.
func TestKeys(t *testing.T) {
	at := time.Date(2026, 3, 8, 7, 0, 0, 500, time.FixedZone("x", 3600))
	for _, c := range []struct{ got, want string }{
		{Invocation("events", "workers", "1700000000000-0"), "relay:invocation:events:workers:1700000000000-0"},
		{Invocation("a:b", "g%1", "1-0"), "relay:invocation:a%3Ab:g%251:1-0"},
		{DLQ("events"), "relay:events:dlq"},
		{ScheduleOccurrence("events", "billing", "nightly", at), "relay:schedule:billing:nightly:2026-03-08T06:00:00Z"},
		{ScheduleOccurrence("{orders}.in", "billing", "nightly", at), "relay:schedule:{orders}:billing:nightly:2026-03-08T06:00:00Z"},
		{Idempotency("events", "order-7"), "relay:idempotency:events:order-7"},
		{Idempotency("{orders}.in", "order:7%"), "relay:idempotency:{orders}:{orders}.in:order%3A7%25"},
		{Idempotency("a:b", "{k}"), "relay:idempotency:a%3Ab:{k}"},
		{Stats("events", "workers"), "relay:stats:events:workers"},
		{Feed("events", "workers"), "relay:feed:events:workers"},
		{Feed("a:b", "g%"), "relay:feed:a%3Ab:g%25"},
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

// TestSlot checks the CRC16 slot function against values from the
// Redis Cluster specification (and, in cmd/relay's TestClusterConnect, against
// CLUSTER KEYSLOT on a real cluster).
func TestSlot(t *testing.T) {
	for key, want := range map[string]uint16{
		"123456789":         0x31C3 % slotCount, // the CRC16/XMODEM check value
		"somekey":           11058,
		"foo{hash_tag}":     2515,
		"{hash_tag}.events": 2515,
		"{}hash_tag":        Slot("{}hash_tag"), // empty tag: the whole key, see below
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
	if Slot("{}a") == Slot("a") {
		t.Error("an empty hash tag must not reduce the key to its tag")
	}
}

// TestIdempotencySharesTheStreamsSlot: under Redis Cluster the publish
// script names the dedup key and the stream together, so they must hash to
// one slot whatever the idempotency key holds, braces included; and the
// escaping keeps two (stream, key) pairs from building one name.
func TestIdempotencySharesTheStreamsSlot(t *testing.T) {
	for _, stream := range []string{"{orders}", "{orders}.events", "x{p}y"} {
		for _, key := range []string{"order-7", "{other}", "a:b", "}{", "%3A", strings.Repeat("k", 256)} {
			if got, want := Slot(Idempotency(stream, key)), Slot(stream); got != want {
				t.Errorf("Idempotency(%q, %q) = %s: slot %d, the stream's is %d", stream, key, Idempotency(stream, key), got, want)
			}
		}
	}
	if Idempotency("a:b", "c") == Idempotency("a", "b:c") {
		t.Error("stream and key segments can be forged with ':'")
	}
	if Idempotency("{t}", "k") == Idempotency("{t}:{t}", "k") {
		t.Error("the inserted hash tag can be forged by the stream name")
	}
}

func TestCheckClusterLayout(t *testing.T) {
	for _, tc := range []struct {
		name     string
		streams  []string
		err      []string
		warnings int
	}{
		{"tagged", []string{"{orders}", "{payments}.events"}, nil, 0},
		{"no tag", []string{"orders"}, []string{`stream "orders" has no hash tag`, `rename it to "{orders}"`}, 0},
		{"empty tag", []string{"{}orders"}, []string{"has no hash tag"}, 0},
		{"colon in tag", []string{"{a:b}"}, []string{"hashes to slot", "use a tag such as {a-b}"}, 0},
		{"percent in tag", []string{"{a%b}.x"}, []string{"must not contain ':' or '%'"}, 0},
		{"shared tag", []string{"{o}.a", "{o}.b", "{p}"}, nil, 1},
		{"one bad of two", []string{"{ok}", "bad"}, []string{`"bad" has no hash tag`}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			warnings, err := CheckClusterLayout(tc.streams, "workers")
			if len(warnings) != tc.warnings {
				t.Errorf("warnings %q, want %d", warnings, tc.warnings)
			}
			if tc.err == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				// The claim behind a clean result: every derived key shares the stream's slot.
				for _, s := range tc.streams {
					for _, k := range Derived(s, "workers") {
						if Slot(k) != Slot(s) {
							t.Errorf("%s: slot %d, stream %s: slot %d", k, Slot(k), s, Slot(s))
						}
					}
				}
				return
			}
			for _, w := range tc.err {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v, want it to contain %q", err, w)
				}
			}
		})
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

// IsSlots tells a slots key from every other key, whatever the stream,
// group, field and limit key hold.
func TestIsSlots(t *testing.T) {
	for _, c := range []struct {
		key  string
		want bool
	}{
		{Limit("orders", "g", "slots", "shop/charge", "c-1"), true},
		{Limit("{o}:slots:", "g:slots:", "slots", "a/h", ":slots:"), true},
		{Limit("orders", "g", "rate", "shop/charge", ":slots:"), false},
		{Limit("o:slots:x", "g", "debounce", "a/h", "k"), false},
		{Invocation("relay:limit:x:slots:", "g", "1-0"), false},
		{DLQ("orders"), false},
	} {
		if got := IsSlots(c.key); got != c.want {
			t.Errorf("IsSlots(%q) = %v, want %v", c.key, got, c.want)
		}
	}
}
