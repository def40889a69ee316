package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/internal/topology"
)

// isolateRedisEnv is isolateEnv plus the connection settings of redis.go.
func isolateRedisEnv(t *testing.T) {
	t.Helper()
	isolateEnv(t)
	for _, k := range []string{"REDIS_CLUSTER", "REDIS_SENTINEL_MASTER", "REDIS_USERNAME", "REDIS_PASSWORD",
		"REDIS_SENTINEL_USERNAME", "REDIS_SENTINEL_PASSWORD", "REDIS_TLS_CA_FILE", "REDIS_TLS_CERT_FILE", "REDIS_TLS_KEY_FILE"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
}

// TestRedisOptions pins how each documented REDIS_URI form and setting
// becomes client options (docs/deployment.md#connecting-to-redis).
func TestRedisOptions(t *testing.T) {
	type want struct {
		Addrs              []string
		User, Pass         string
		DB                 int
		TLS                bool
		MasterSet          string
		SentUser, SentPass string
	}
	for _, tc := range []struct {
		name string
		g    Globals
		want want
	}{
		{"host:port", Globals{RedisURI: "10.0.0.1:6380"}, want{Addrs: []string{"10.0.0.1:6380"}}},
		{"redis URI with ACL user and db", Globals{RedisURI: "redis://relay:s3cret@redis.internal:6379/2"},
			want{Addrs: []string{"redis.internal:6379"}, User: "relay", Pass: "s3cret", DB: 2}},
		{"default port", Globals{RedisURI: "redis://redis.internal"}, want{Addrs: []string{"redis.internal:6379"}}},
		{"cluster seed list", Globals{RedisURI: "redis://a:7000,b:7001, c"},
			want{Addrs: []string{"a:7000", "b:7001", "c:6379"}}},
		{"plain seed list", Globals{RedisURI: "a:7000,b:7001"}, want{Addrs: []string{"a:7000", "b:7001"}}},
		{"addr query", Globals{RedisURI: "redis://a:7000?addr=b:7001&addr=c:7002"},
			want{Addrs: []string{"a:7000", "b:7001", "c:7002"}}},
		{"REDIS_CLUSTER with one seed", Globals{RedisURI: "a:7000", RedisCluster: true}, want{Addrs: []string{"a:7000"}}},
		{"TLS", Globals{RedisURI: "rediss://u:p@a:6380,b:6380"},
			want{Addrs: []string{"a:6380", "b:6380"}, User: "u", Pass: "p", TLS: true}},
		{"env credentials override the URI's", Globals{RedisURI: "redis://old:old@a:1", RedisUsername: "relay", RedisPassword: "pw"},
			want{Addrs: []string{"a:1"}, User: "relay", Pass: "pw"}},
		{"requirepass only", Globals{RedisURI: "a:1", RedisPassword: "pw"}, want{Addrs: []string{"a:1"}, Pass: "pw"}},
		{"sentinel", Globals{RedisURI: "redis://:pw@s1:26379,s2:26379,s3:26379/1", RedisSentinelMaster: "main",
			RedisSentinelPassword: "spw"},
			want{Addrs: []string{"s1:26379", "s2:26379", "s3:26379"}, Pass: "pw", DB: 1, MasterSet: "main", SentPass: "spw"}},
		{"sentinel in the URI", Globals{RedisURI: "redis://s1:26379?master_set=main&addr=s2:26379"},
			want{Addrs: []string{"s1:26379", "s2:26379"}, MasterSet: "main"}},
		{"sentinel in both, same name", Globals{RedisURI: "redis://s1:26379?master_set=main", RedisSentinelMaster: "main"},
			want{Addrs: []string{"s1:26379"}, MasterSet: "main"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt, err := tc.g.redisOptions()
			if err != nil {
				t.Fatal(err)
			}
			got := want{Addrs: opt.InitAddress, User: opt.Username, Pass: opt.Password, DB: opt.SelectDB,
				TLS: opt.TLSConfig != nil, MasterSet: opt.Sentinel.MasterSet,
				SentUser: opt.Sentinel.Username, SentPass: opt.Sentinel.Password}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got)\n%s", d)
			}
			if !opt.DisableCache {
				t.Error("client-side caching is on")
			}
			if opt.TLSConfig != nil && opt.TLSConfig.ServerName != "" {
				t.Errorf("TLS ServerName %q fixed for every node; want each connection's own host", opt.TLSConfig.ServerName)
			}
			if opt.Sentinel.MasterSet != "" && (opt.Sentinel.TopologyRefreshInterval <= 0 || (opt.TLSConfig != nil) != (opt.Sentinel.TLSConfig != nil)) {
				t.Errorf("sentinel options %+v: want a topology refresh and the data nodes' TLS", opt.Sentinel)
			}
		})
	}
}

func TestRedisOptionsErrors(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		g    Globals
		want string
	}{
		{"bad scheme", Globals{RedisURI: "http://a:1"}, "invalid URL scheme"},
		{"empty host in list", Globals{RedisURI: "redis://a:1,,b:2"}, "empty address"},
		{"cluster and sentinel", Globals{RedisURI: "a:1", RedisCluster: true, RedisSentinelMaster: "m"}, "exclude each other"},
		{"cluster db", Globals{RedisURI: "redis://a:1,b:2/3"}, "Redis Cluster has only database 0: remove /3"},
		{"cluster db with REDIS_CLUSTER", Globals{RedisURI: "redis://a:1/3", RedisCluster: true}, "only database 0"},
		{"cluster over unix", Globals{RedisURI: "unix:///run/redis.sock", RedisCluster: true}, "over TCP"},
		{"sentinel over unix", Globals{RedisURI: "unix:///run/redis.sock", RedisSentinelMaster: "m"}, "over TCP"},
		{"two master sets", Globals{RedisURI: "redis://s:1?master_set=a", RedisSentinelMaster: "b"}, `master set "a"`},
		{"sentinel password alone", Globals{RedisURI: "a:1", RedisSentinelPassword: "x"}, "set REDIS_SENTINEL_MASTER too"},
		{"user without password", Globals{RedisURI: "redis://relay@a:1"}, `user "relay" has no password`},
		{"CA without TLS", Globals{RedisURI: "redis://a:1", RedisTLSCAFile: ca}, "use a rediss:// REDIS_URI"},
		{"CA not PEM", Globals{RedisURI: "rediss://a:1", RedisTLSCAFile: ca}, "holds no PEM certificate"},
		{"CA missing", Globals{RedisURI: "rediss://a:1", RedisTLSCAFile: ca + ".missing"}, "no such file"},
		{"cert without key", Globals{RedisURI: "rediss://a:1", RedisTLSCertFile: ca}, "go together"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.g.redisOptions()
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want a usage error containing %q", err, tc.want)
			}
		})
	}
	// A password in a bad URI is not echoed.
	_, err := (&Globals{RedisURI: "redis://u:hunter2@a:1,,b"}).redisOptions()
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %v shows the password", err)
	}
}

func TestRedactURI(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:6379":                   "127.0.0.1:6379",
		"redis://u:p@h:1/0":                "redis://u:***@h:1/0",
		"rediss://:p@a:1,b:2":              "rediss://:***@a:1,b:2",
		"redis://user@h:1":                 "redis://user@h:1",
		"redis://u:p@ss@h:1?master_set=m":  "redis://u:***@h:1?master_set=m",
		"unix:///run/redis/redis-server.s": "unix:///run/redis/redis-server.s",
	} {
		if got := redactURI(in); got != want {
			t.Errorf("redactURI(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCLIRedisSettings runs the CLI with settings that are wrong without
// a connection: each is a usage error that says what to change.
func TestCLIRedisSettings(t *testing.T) {
	isolateRedisEnv(t)
	apps := cliApps(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"validate rejects an untagged stream under REDIS_CLUSTER",
			map[string]string{"REDIS_CLUSTER": "true", "REDIS_STREAM": "orders", "REDIS_URI": "127.0.0.1:1"},
			[]string{"validate", "--apps", apps}, `relay: stream "orders" has no hash tag`},
		{"a seed list means cluster",
			map[string]string{"REDIS_STREAM": "{orders},payments", "REDIS_URI": "redis://127.0.0.1:1,127.0.0.1:2"},
			[]string{"validate", "--apps", apps}, `rename it to "{payments}"`},
		{"start rejects it before connecting",
			map[string]string{"REDIS_CLUSTER": "1", "REDIS_STREAM": "orders", "REDIS_URI": "127.0.0.1:1", "REDIS_GROUP": "g"},
			[]string{"start", "--apps", apps, "--runner", "process"}, `rename it to "{orders}", in REDIS_STREAM and in the publishers`},
		{"cluster and sentinel",
			map[string]string{"REDIS_CLUSTER": "true", "REDIS_SENTINEL_MASTER": "m"},
			[]string{"validate", "--apps", apps}, "exclude each other"},
		{"dlq takes one stream",
			map[string]string{"REDIS_STREAM": "{a},{b}", "REDIS_URI": "127.0.0.1:1"},
			[]string{"dlq", "ls"}, "REDIS_STREAM names 2 streams ({a}, {b}); only relay start takes a list"},
		{"stats takes one stream",
			map[string]string{"REDIS_STREAM": "a,b", "REDIS_URI": "127.0.0.1:1", "REDIS_GROUP": "g"},
			[]string{"stats"}, "only relay start takes a list"},
		{"empty name in the list",
			map[string]string{"REDIS_STREAM": "a,,b"},
			[]string{"validate", "--apps", apps}, "empty stream name"},
		{"repeated name",
			map[string]string{"REDIS_STREAM": "a, a"},
			[]string{"validate", "--apps", apps}, `names stream "a" twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			r := relayCLI(t, "", tc.args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr:\n%s\nwant exit 2 and %q", r.code, r.stderr, tc.want)
			}
		})
	}
	// A tagged stream list passes validate under REDIS_CLUSTER.
	t.Setenv("REDIS_CLUSTER", "true")
	t.Setenv("REDIS_STREAM", "{orders},{payments}.events")
	if r := relayCLI(t, "", "validate", "--apps", filepath.Join("testdata", "apps")); strings.Contains(r.stderr, "hash") {
		t.Errorf("tagged streams rejected: %s", r.stderr)
	}
}

// TestClusterConnect connects to a 3-master cluster started by
// scripts/cluster.sh through each documented form, and checks that relay
// start refuses an untagged stream once it finds out it is on a cluster.
func TestClusterConnect(t *testing.T) {
	isolateRedisEnv(t)
	c := topology.NewCluster(t)
	ctx := context.Background()
	for _, g := range []Globals{
		{RedisURI: strings.Join(c.Seeds, ",")},
		{RedisURI: "redis://" + c.Seeds[0] + "?addr=" + c.Seeds[1]},
		{RedisURI: c.Seeds[2], RedisCluster: true},
	} {
		rc, err := g.redisClient()
		if err != nil {
			t.Fatalf("%s: %v", g.RedisURI, err)
		}
		if rc.Mode() != rueidis.ClientModeCluster {
			t.Errorf("%s: mode %s, want cluster", g.RedisURI, rc.Mode())
		}
		// Keys of every master are reachable, and our slot function agrees with the server's.
		for _, k := range []string{"{orders}", keys.DLQ("{orders}"), "a", "b", "c", keys.Invocation("{x}", "g", "1-0")} {
			if err := rc.Do(ctx, rc.B().Set().Key(k).Value("v").Build()).Error(); err != nil {
				t.Errorf("SET %s: %v", k, err)
			}
			slot, err := rc.Do(ctx, rc.B().ClusterKeyslot().Key(k).Build()).AsInt64()
			if err != nil || slot != int64(keys.Slot(k)) {
				t.Errorf("CLUSTER KEYSLOT %s = %d (%v), keys.Slot = %d", k, slot, err, keys.Slot(k))
			}
		}
		rc.Close()
	}

	// An ACL user with the documented rules plus cluster|slots works as a
	// cluster client; without cluster|slots the client cannot learn the
	// slots, which REDIS_CLUSTER turns into a clear error.
	node := func(addr string) rueidis.Client {
		nc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	for _, seed := range c.Seeds {
		nc := node(seed)
		rules := append([]string{"on", ">s3cret"}, strings.Fields(aclRules+" "+aclClusterRules)...)
		if err := nc.Do(ctx, nc.B().AclSetuser().Username("relay").Rule(rules...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	acl := Globals{RedisURI: "redis://relay:s3cret@" + c.Seeds[0], RedisCluster: true}
	rc, err := acl.redisClient()
	if err != nil {
		t.Fatalf("ACL user with %q: %v", aclClusterRules, err)
	}
	if err := rc.Do(ctx, rc.B().Xadd().Key("{acl}").Id("*").FieldValue().FieldValue("event", "{}").Build()).Error(); err != nil {
		t.Errorf("XADD as the ACL user: %v", err)
	}
	rc.Close()
	for _, seed := range c.Seeds {
		nc := node(seed)
		if err := nc.Do(ctx, nc.B().AclSetuser().Username("relay").Rule("-cluster|slots").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := acl.redisClient(); err == nil || !strings.Contains(err.Error(), "+cluster|slots") {
		t.Errorf("ACL user without cluster|slots: %v, want the REDIS_CLUSTER error naming the permission", err)
	}

	// One address of a cluster node is a cluster for rueidis: relay start
	// checks the layout after connecting.
	t.Setenv("REDIS_URI", c.Seeds[0])
	t.Setenv("REDIS_STREAM", "orders")
	t.Setenv("REDIS_GROUP", "g")
	r := relayCLI(t, "", "start", "--apps", cliApps(t), "--runner", "process", "--state-dir", t.TempDir())
	if r.code != exitUsage || !strings.Contains(r.stderr, `stream "orders" has no hash tag`) {
		t.Errorf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
}

// TestClusterRequiredButSingle: REDIS_CLUSTER against a plain server fails
// and says so, rather than running without the cluster guarantees.
func TestClusterRequiredButSingle(t *testing.T) {
	g := Globals{RedisURI: redistest.Addr(t), RedisCluster: true}
	_, err := g.redisClient()
	if err == nil || !strings.Contains(err.Error(), "does not serve as a Redis Cluster") {
		t.Fatalf("got %v, want a not-a-cluster error", err)
	}
	g = Globals{RedisURI: redistest.Addr(t) + "," + redistest.Addr(t)}
	_, err = g.redisClient()
	if err == nil || !strings.Contains(err.Error(), "several addresses in REDIS_URI name cluster seed nodes") {
		t.Fatalf("got %v, want the seed-list hint", err)
	}
}

// TestSentinelConnect reaches the master through the sentinels of
// scripts/sentinel.sh, and reaches the new master after a failover.
func TestSentinelConnect(t *testing.T) {
	s := topology.NewSentinel(t, topology.SentinelOptions{DownAfter: time.Second})
	ctx := context.Background()
	g := Globals{RedisURI: "redis://" + strings.Join(s.Sentinels, ","), RedisSentinelMaster: s.MasterSet}
	rc, err := g.redisClient()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if rc.Mode() != rueidis.ClientModeSentinel {
		t.Errorf("mode %s, want sentinel", rc.Mode())
	}
	role := func() string {
		info, err := rc.Do(ctx, rc.B().Info().Section("replication").Build()).ToString()
		if err != nil {
			return ""
		}
		for l := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "role:"); ok {
				return v
			}
		}
		return ""
	}
	if err := rc.Do(ctx, rc.B().Set().Key("k").Value("before").Build()).Error(); err != nil || role() != "master" {
		t.Fatalf("write through the sentinels: %v, role %q", err, role())
	}
	old, err := s.KillMaster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "a write on the promoted replica", func() bool {
		m, err := s.Master(ctx)
		if err != nil || m == old {
			return false
		}
		cfg, err := rc.Do(ctx, rc.B().ConfigGet().Parameter("port").Build()).AsStrMap()
		return err == nil && cfg["port"] == portOf(m) &&
			rc.Do(ctx, rc.B().Set().Key("k").Value("after").Build()).Error() == nil
	})
	if got, err := rc.Do(ctx, rc.B().Get().Key("k").Build()).ToString(); err != nil || got != "after" {
		t.Errorf("GET k = %q, %v after failover", got, err)
	}
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// TestACLUser connects as an ACL user given in the URI or in
// REDIS_USERNAME/REDIS_PASSWORD; a wrong password fails naming the server.
func TestACLUser(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	admin := redistest.Connect(t, srv.Addr)
	ctx := context.Background()
	if err := admin.Do(ctx, admin.B().AclSetuser().Username("relay").Rule("on", ">s3cret", "~*", "&*", "+@all").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, g := range []Globals{
		{RedisURI: "redis://relay:s3cret@" + srv.Addr},
		{RedisURI: srv.Addr, RedisUsername: "relay", RedisPassword: "s3cret"},
	} {
		rc, err := g.redisClient()
		if err != nil {
			t.Fatalf("%s: %v", redactURI(g.RedisURI), err)
		}
		who, err := rc.Do(ctx, rc.B().AclWhoami().Build()).ToString()
		rc.Close()
		if err != nil || who != "relay" {
			t.Errorf("ACL WHOAMI = %q, %v; want relay", who, err)
		}
	}
	_, err := (&Globals{RedisURI: "redis://relay:wrong@" + srv.Addr}).redisClient()
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") || strings.Contains(err.Error(), "wrong@") {
		t.Errorf("wrong password: %v", err)
	}
}

// aclRules are the ACL rules docs/deployment.md recommends for Relay's
// user; TestACLWorker runs a worker under exactly these.
const aclRules = "-@all +@stream +@hash +@sortedset +@scripting +@string +@keyspace +@connection +time +info +memory|usage ~*"

// aclClusterRules are what a Redis Cluster user needs on top of aclRules:
// the client learns the slot map with CLUSTER SLOTS.
const aclClusterRules = "+cluster|slots"

// aclUser makes ACL user user, password s3cret, with rules.
func aclUser(t *testing.T, admin rueidis.Client, user, rules string) {
	t.Helper()
	rule := append([]string{"on", ">s3cret"}, strings.Fields(rules)...)
	if err := admin.Do(t.Context(), admin.B().AclSetuser().Username(user).Rule(rule...).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// aclEnv points the CLI's Redis password, stream (events), group (relay)
// and apps at what the ACL tests use; each test sets REDIS_URI with its
// user.
func aclEnv(t *testing.T) {
	t.Setenv("REDIS_PASSWORD", "s3cret")
	t.Setenv("REDIS_STREAM", "events")
	t.Setenv("REDIS_GROUP", "relay")
	t.Setenv("RELAY_APPS", cliApps(t))
}

// TestACLWorker runs relay start as an ACL user limited to the rules that
// docs/deployment.md documents: a handler runs and its message is acked, a
// malformed event is dead-lettered, schedules start, and relay stats and
// relay dlq ls work for that user too.
func TestACLWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a worker")
	}
	isolateRedisEnv(t)
	srv := redistest.Start(t, redistest.Options{})
	admin := redistest.Connect(t, srv.Addr)
	ctx := context.Background()
	aclUser(t, admin, "relay", aclRules)
	aclEnv(t)
	t.Setenv("REDIS_URI", "redis://relay@"+srv.Addr)

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	stdout, stderr := &testutil.Buffer{}, &testutil.Buffer{}
	exit := make(chan int, 1)
	go func() {
		exit <- run(wctx, []string{"start", "--runner", "process", "--state-dir", t.TempDir(), "--consumer", "acl"}, stdout, stderr)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stderr:\n%s", stderr)
		}
	})
	testutil.WaitFor(t, 30*time.Second, "worker started", func() bool { return strings.Contains(stderr.String(), "worker started") })
	var ids []string
	for _, ev := range []string{`{"kind":"refund"}`, `not json`} {
		id, err := admin.Do(ctx, admin.B().Xadd().Key("events").Id("*").FieldValue().FieldValue("event", ev).Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// The shop app's schedule also publishes a catch-up occurrence, whose
	// handler fails and stays pending: only these two ids are checked.
	testutil.WaitFor(t, 30*time.Second, "both messages acked, one dead-lettered", func() bool {
		for _, id := range ids {
			p, err := admin.Do(ctx, admin.B().Xpending().Key("events").Group("relay").Start(id).End(id).Count(1).Build()).ToArray()
			if err != nil || len(p) != 0 {
				return false
			}
		}
		dlqLen, _ := admin.Do(ctx, admin.B().Xlen().Key(keys.DLQ("events")).Build()).AsInt64()
		// Delivered (the handler ran, the DLQ entry exists) and no longer pending: acked.
		return dlqLen == 1 && strings.Contains(stdout.String(), "[shop/refunds.run] refunded")
	})
	stop()
	select {
	case code := <-exit:
		if code != exitOK {
			t.Errorf("relay start exited %d", code)
		}
	case <-time.After(time.Minute):
		t.Fatal("relay start did not stop")
	}
	if strings.Contains(stderr.String(), "NOPERM") {
		t.Errorf("the worker hit a missing ACL permission:\n%s", stderr)
	}
	// health's access probe reads every key the worker wrote, the
	// dead-letter stream and the invocation hashes among them. Its apps
	// check reads valid apps: cli_apps holds a broken one on purpose.
	for _, args := range [][]string{{"stats"}, {"dlq", "ls"}, {"health", "--runner", "process", "--apps", validApps}} {
		if r := relayCLI(t, "", args...); r.code != exitOK {
			t.Errorf("relay %s as the ACL user: exit %d\n%s", strings.Join(args, " "), r.code, r.stderr)
		}
	}
	// The memory budget (docs/operations.md#memory-budget) is measured
	// under these rules too, not skipped for a missing permission.
	if r := relayCLI(t, "", "stats", "--json"); !strings.Contains(r.stdout, `"used_bytes"`) || strings.Contains(r.stdout, "memory_error") {
		t.Errorf("relay stats --json as the ACL user measured no memory:\n%s", r.stdout)
	}
	if r := relayCLI(t, "", "health", "--runner", "process"); !regexp.MustCompile(`memory budget +ok`).MatchString(r.stdout) {
		t.Errorf("relay health as the ACL user did not check the memory budget:\n%s", r.stdout)
	}
}

// TestACLMissingPermissions gives relay users that lack what
// docs/deployment.md lists: scripts, or the keys under relay:. Such a worker
// would read messages and fail every claim while looking healthy, so relay
// start refuses to start, naming the refusal, and relay health fails its
// access check; a user with the documented narrower key pattern (the
// stream and relay:*) passes.
func TestACLMissingPermissions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a redis-server")
	}
	isolateRedisEnv(t)
	srv := redistest.Start(t, redistest.Options{})
	admin := redistest.Connect(t, srv.Addr)
	ctx := context.Background()
	if err := admin.Do(ctx, admin.B().Xadd().Key("events").Id("*").FieldValue().FieldValue("event", `{"kind":"refund"}`).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	users := map[string]string{
		"noscripts":  strings.Replace(aclRules, " +@scripting", "", 1),
		"streamonly": strings.Replace(aclRules, " ~*", " ~events", 1),
		"narrow":     strings.Replace(aclRules, " ~*", " ~events ~relay:*", 1),
	}
	for user, rules := range users {
		aclUser(t, admin, user, rules)
	}
	aclEnv(t)
	for _, user := range []string{"noscripts", "streamonly"} {
		t.Run(user, func(t *testing.T) {
			t.Setenv("REDIS_URI", "redis://"+user+"@"+srv.Addr)
			wctx, stop := context.WithTimeout(ctx, 30*time.Second)
			defer stop()
			var stdout, stderr testutil.Buffer
			code := run(wctx, []string{"start", "--runner", "process", "--state-dir", t.TempDir(), "--consumer", user}, &stdout, &stderr)
			if code != exitFailure || !strings.Contains(stderr.String(), "NOPERM") || !strings.Contains(stderr.String(), "docs/deployment.md") {
				t.Errorf("relay start as %s: exit %d, want %d naming NOPERM and docs/deployment.md:\n%s", user, code, exitFailure, stderr.String())
			}
			if strings.Contains(stderr.String(), "worker started") {
				t.Errorf("relay start as %s started a worker:\n%s", user, stderr.String())
			}
			r := relayCLI(t, "", "health", "--runner", "process")
			if r.code != exitFailure || !regexp.MustCompile(`redis access +FAIL .*NOPERM`).MatchString(r.stdout) {
				t.Errorf("relay health as %s: exit %d, want %d with redis access FAIL naming NOPERM:\n%s%s", user, r.code, exitFailure, r.stdout, r.stderr)
			}
		})
	}
	// The group exists now only if a worker started; it must not hold the
	// event as pending for a consumer that could never claim it.
	if p, err := admin.Do(ctx, admin.B().Xpending().Key("events").Group("relay").Build()).ToArray(); err == nil {
		if n, _ := p[0].AsInt64(); n != 0 {
			t.Errorf("%d messages pending after the refused starts, want 0", n)
		}
	}
	t.Setenv("REDIS_URI", "redis://narrow@"+srv.Addr)
	if err := admin.Do(ctx, admin.B().XgroupCreate().Key("events").Group("relay").Id("0").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// A dead-letter stream and an invocation hash exist, as they do on any
	// Redis a worker ran on: the probe reads each as what it is.
	for _, cmd := range []rueidis.Completed{
		admin.B().Xadd().Key(keys.DLQ("events")).Id("*").FieldValue().FieldValue("reason", "test").Build(),
		admin.B().Hset().Key(keys.Invocation("events", "relay", "0-0")).FieldValue().FieldValue("shop/refunds.run", "ok").Build(),
	} {
		if err := admin.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if r := relayCLI(t, "", "health", "--runner", "process", "--apps", validApps); r.code != exitOK || !regexp.MustCompile(`redis access +ok`).MatchString(r.stdout) {
		t.Errorf("relay health as the user of the documented narrower key pattern: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestRedisAuthHints: a server that wants a password and gets none, or
// the wrong one, is answered with the setting to change, and relay health
// says the login was refused rather than that Redis is unreachable.
func TestRedisAuthHints(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a redis-server")
	}
	isolateRedisEnv(t)
	srv := redistest.Start(t, redistest.Options{})
	admin := redistest.Connect(t, srv.Addr)
	if err := admin.Do(context.Background(), admin.B().ConfigSet().ParameterValue().ParameterValue("requirepass", "s3cret").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDIS_URI", srv.Addr)
	t.Setenv("REDIS_STREAM", "events")
	t.Setenv("REDIS_GROUP", "relay")
	t.Setenv("RELAY_APPS", cliApps(t))
	r := relayCLI(t, "", "start", "--runner", "process", "--state-dir", t.TempDir())
	if r.code != exitFailure || !strings.Contains(r.stderr, "NOAUTH") || !strings.Contains(r.stderr, "set REDIS_PASSWORD") {
		t.Errorf("relay start without a password: exit %d, want %d naming NOAUTH and REDIS_PASSWORD:\n%s", r.code, exitFailure, r.stderr)
	}
	t.Setenv("REDIS_PASSWORD", "wrong")
	r = relayCLI(t, "", "health", "--runner", "process")
	if r.code != exitFailure || !regexp.MustCompile(`redis +FAIL +\S+ refused the login: WRONGPASS.*check REDIS_USERNAME and REDIS_PASSWORD`).MatchString(r.stdout) {
		t.Errorf("relay health with a wrong password: exit %d, want %d saying the login was refused:\n%s%s", r.code, exitFailure, r.stdout, r.stderr)
	}
}

// TestTLS connects over rediss:// to a redis-server that serves TLS only
// and requires client certificates, trusting a private CA from
// REDIS_TLS_CA_FILE.
func TestTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a redis-server")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("RELAY_TEST_REQUIRE") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir := t.TempDir()
	pki := newTestPKI(t, dir)
	port := testutil.FreePort(t)
	cmd := exec.Command("redis-server", "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", pki.serverCert, "--tls-key-file", pki.serverKey, "--tls-ca-cert-file", pki.ca,
		"--tls-auth-clients", "yes", "--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	testutil.WaitFor(t, 10*time.Second, "redis-server TLS port", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	ctx := context.Background()
	g := Globals{RedisURI: "rediss://" + addr, RedisTLSCAFile: pki.ca, RedisTLSCertFile: pki.clientCert, RedisTLSKeyFile: pki.clientKey}
	rc, err := g.redisClient()
	if err != nil {
		t.Fatalf("rediss:// with the private CA and a client certificate: %v", err)
	}
	if err := rc.Do(ctx, rc.B().Ping().Build()).Error(); err != nil {
		t.Errorf("PING over TLS: %v", err)
	}
	rc.Close()

	// Without the CA the server is not trusted; without a client
	// certificate the server refuses the client.
	for name, g := range map[string]Globals{
		"system CA pool":         {RedisURI: "rediss://" + addr, RedisTLSCertFile: pki.clientCert, RedisTLSKeyFile: pki.clientKey},
		"no client certificate":  {RedisURI: "rediss://" + addr, RedisTLSCAFile: pki.ca},
		"plain text to TLS port": {RedisURI: addr},
	} {
		rc, err := g.redisClient()
		if err == nil {
			err = rc.Do(ctx, rc.B().Ping().Build()).Error()
			rc.Close()
		}
		if err == nil {
			t.Errorf("%s: connected, want a failure", name)
		}
	}
}

type testPKI struct{ ca, serverCert, serverKey, clientCert, clientKey string }

// newTestPKI writes a private CA and a server (127.0.0.1) and client
// certificate signed by it into dir.
func newTestPKI(t *testing.T, dir string) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "relay test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", keyDER)
	}
	p := testPKI{ca: write("ca.pem", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

// TestStartStreamListOneFails: relay start with a stream list runs one
// engine per stream; when one cannot start (here its key holds a string, so
// its group cannot be created), the others stop and start exits 1 naming it.
func TestStartStreamListOneFails(t *testing.T) {
	isolateRedisEnv(t)
	rc := redistest.Client(t)
	ctx := context.Background()
	good, bad := redistest.Name(t, "good"), redistest.Name(t, "bad")
	if err := rc.Do(ctx, rc.B().Set().Key(bad).Value("not a stream").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDIS_URI", redistest.Addr(t))
	t.Setenv("REDIS_STREAM", good+", "+bad)
	t.Setenv("REDIS_GROUP", "relay")
	done := make(chan cliRun, 1)
	go func() {
		done <- relayCLI(t, "", "start", "--apps", cliApps(t), "--runner", "process", "--state-dir", t.TempDir())
	}()
	select {
	case r := <-done:
		// The error lines (after the logs) name the failed stream only.
		_, errLines, _ := strings.Cut(r.stderr, "\nrelay: ")
		if r.code != exitFailure || !strings.Contains(errLines, `stream "`+bad+`"`) || !strings.Contains(errLines, "WRONGTYPE") ||
			strings.Contains(errLines, good) {
			t.Errorf("exit %d, stderr:\n%s\nwant exit 1 and an error naming %s only", r.code, r.stderr, bad)
		}
	case <-time.After(time.Minute):
		t.Fatal("relay start kept running with one of its streams failed")
	}
}
