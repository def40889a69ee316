package redisinfo_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redisinfo"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/topology"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func configSet(t *testing.T, c rueidis.Client, kv ...string) {
	t.Helper()
	for i := 0; i < len(kv); i += 2 {
		if err := c.Do(t.Context(), c.B().ConfigSet().ParameterValue().ParameterValue(kv[i], kv[i+1]).Build()).Error(); err != nil {
			t.Fatalf("CONFIG SET %s %s: %v", kv[i], kv[i+1], err)
		}
	}
}

// TestMemoryPolicies reads the policy a private server has, before and
// after CONFIG SET changes it.
func TestMemoryPolicies(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	got, err := redisinfo.MemoryPolicies(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]redisinfo.Memory{{Addr: srv.Addr, Policy: "noeviction"}}, got); diff != "" {
		t.Errorf("default server (-want +got):\n%s", diff)
	}
	if ev, err := redisinfo.Evicting(t.Context(), c); err != nil || len(ev) != 0 {
		t.Errorf("Evicting = %v, %v; want none", ev, err)
	}

	configSet(t, c, "maxmemory-policy", "allkeys-lru", "maxmemory", "104857600")
	ev, err := redisinfo.Evicting(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	want := []redisinfo.Memory{{Addr: srv.Addr, Policy: "allkeys-lru", MaxMemory: 100 << 20}}
	if diff := cmp.Diff(want, ev); diff != "" {
		t.Errorf("after CONFIG SET (-want +got):\n%s", diff)
	}
	if s := ev[0].String(); s != srv.Addr+": maxmemory-policy allkeys-lru, maxmemory 104857600 bytes" {
		t.Errorf("String() = %q", s)
	}
}

// TestEvictingCluster finds the one node of a cluster that may evict.
func TestEvictingCluster(t *testing.T) {
	cl := topology.NewCluster(t)
	c := topology.Connect(t, cl.ClientOption())
	all, err := redisinfo.MemoryPolicies(t.Context(), c)
	if err != nil || len(all) < 3 {
		t.Fatalf("MemoryPolicies = %v, %v; want every node", all, err)
	}
	one := all[1].Addr
	// A client of that node alone: rueidis would find the cluster again.
	node := topology.Connect(t, rueidis.ClientOption{InitAddress: []string{one}, ForceSingleClient: true, DisableCache: true})
	configSet(t, node, "maxmemory-policy", "volatile-lru")
	ev, err := redisinfo.Evicting(t.Context(), c)
	if err != nil || len(ev) != 1 || ev[0].Addr != one || ev[0].Policy != "volatile-lru" {
		t.Errorf("Evicting = %v, %v; want only %s with volatile-lru", ev, err, one)
	}
}

func TestParseMemory(t *testing.T) {
	for name, c := range map[string]struct {
		info string
		want redisinfo.Memory
		ok   bool
	}{
		"info":     {"# Memory\r\nused_memory:1000\r\nmaxmemory:0\r\nmaxmemory_human:0B\r\nmaxmemory_policy:noeviction\r\n", redisinfo.Memory{Policy: "noeviction"}, true},
		"verbatim": {"txt:# Memory\r\nmaxmemory:5\r\nmaxmemory_policy:allkeys-lfu\r\n", redisinfo.Memory{Policy: "allkeys-lfu", MaxMemory: 5}, true},
		"missing":  {"# Memory\r\nused_memory:1000\r\n", redisinfo.Memory{}, false},
		"bad":      {"maxmemory:x\r\nmaxmemory_policy:noeviction\r\n", redisinfo.Memory{}, false},
	} {
		got, err := redisinfo.ParseMemory(c.info)
		if got != c.want || (err == nil) != c.ok {
			t.Errorf("%s: ParseMemory = %+v, %v; want %+v, ok %v", name, got, err, c.want, c.ok)
		}
	}
}

// TestAccess probes the keys of a stream that a worker has used (a
// stream, a dead-letter stream, an invocation hash, a written marker) and
// of one it has not: both pass for a user with the rules of
// docs/deployment.md, and a user without scripts or without the relay:
// keys, or without TIME (refused inside the script), is refused with
// ErrNoPermission.
func TestAccess(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	admin := redistest.Connect(t, srv.Addr)
	ctx := t.Context()
	used := []string{"events", "relay:events:dlq", "relay:invocation:events:g:1-0", "relay:events:dlq:written:g:1-0:a/h"}
	for _, cmd := range []rueidis.Completed{
		admin.B().Xadd().Key(used[0]).Id("*").FieldValue().FieldValue("event", "{}").Build(),
		admin.B().Xadd().Key(used[1]).Id("*").FieldValue().FieldValue("reason", "x").Build(),
		admin.B().Hset().Key(used[2]).FieldValue().FieldValue("a/h", "ok").Build(),
		admin.B().Set().Key(used[3]).Value("1-0").Build(),
	} {
		if err := admin.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	unused := []string{"fresh", "relay:fresh:dlq", "relay:invocation:fresh:g:1-0", keys.Limit("fresh", "g", "slots", "a/h", "k")}
	const rules = "-@all +@stream +@hash +@sortedset +@scripting +@string +@keyspace +@connection +time +info"
	for user, extra := range map[string]string{
		"ok":           "~events ~fresh ~relay:*",
		"noscripts":    "-@scripting ~*",
		"norelay":      "~events ~fresh",
		"notime":       "-time ~*",
		"nosortedsets": "-@sortedset ~*", // the slots of a rule's concurrency across workers
	} {
		rule := append([]string{"on", ">pw"}, strings.Fields(rules+" "+extra)...)
		if err := admin.Do(ctx, admin.B().AclSetuser().Username(user).Rule(rule...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, Username: user, Password: "pw", DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		for i, ks := range [][]string{used, unused} {
			err := redisinfo.Access(ctx, c, ks)
			// Only unused has a slots key, the one a user without
			// sorted sets cannot read.
			allowed := user == "ok" || user == "nosortedsets" && i == 0
			switch {
			case allowed && err != nil:
				t.Errorf("Access(%v) as %s: %v, want nil", ks, user, err)
			case !allowed && (!errors.Is(err, redisinfo.ErrNoPermission) || !strings.Contains(err.Error(), "keys probed: "+strings.Join(ks, ", "))):
				t.Errorf("Access(%v) as %s: %v, want ErrNoPermission naming the keys probed", ks, user, err)
			}
		}
		c.Close()
	}
}
