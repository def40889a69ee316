package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
)

// Connection modes (docs/deployment.md#connecting-to-redis). REDIS_URI
// always lists the addresses to dial first: the server itself, the seed
// nodes of a Redis Cluster, or the sentinels when a master set is named.

// sentinelRefresh is how often a Sentinel client asks the sentinels where
// the master is, on top of following their +switch-master events: one
// missed event would otherwise leave it on a demoted master for good.
const sentinelRefresh = 5 * time.Second

// AfterApply checks the Redis settings that can be checked without a
// connection, for every command, right after the flags and env are read:
// the stream list, conflicting modes and, when the settings say Redis
// Cluster, the hash-tag rule of docs/deployment.md. A failure is a usage
// error (exit 2). kong calls it.
func (g *Globals) AfterApply() error {
	if g.RedisCluster && g.RedisSentinelMaster != "" {
		return usagef("REDIS_CLUSTER and REDIS_SENTINEL_MASTER exclude each other: Sentinel manages one master, Redis Cluster many; set one of them")
	}
	if g.RedisStream == "" {
		return nil
	}
	streams, err := g.streamNames()
	if err != nil {
		return err
	}
	if g.clusterConfigured() {
		if _, err := keys.CheckClusterLayout(streams, g.RedisGroup); err != nil {
			return usageError{err}
		}
	}
	return nil
}

// streamNames splits REDIS_STREAM at commas; blanks around a name are
// ignored. An empty or repeated name is a usage error.
func (g *Globals) streamNames() ([]string, error) {
	var names []string
	for n := range strings.SplitSeq(g.RedisStream, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			return nil, usagef("REDIS_STREAM %q: empty stream name in the list; separate names with single commas", g.RedisStream)
		}
		if slices.Contains(names, n) {
			return nil, usagef("REDIS_STREAM %q names stream %q twice", g.RedisStream, n)
		}
		names = append(names, n)
	}
	return names, nil
}

// clusterConfigured reports whether the settings ask for Redis Cluster:
// REDIS_CLUSTER, or several addresses in REDIS_URI without a Sentinel
// master set. A single address may still turn out to be a cluster node;
// relay start checks the layout again once connected.
func (g *Globals) clusterConfigured() bool {
	if g.RedisCluster {
		return true
	}
	if g.RedisSentinelMaster != "" || g.RedisURI == "" {
		return false
	}
	opt, err := g.redisOptions()
	return err == nil && opt.Sentinel.MasterSet == "" && len(opt.InitAddress) > 1
}

// redisClient connects with the settings of redisOptions, changed by
// tune (relay console's retry policy). With REDIS_CLUSTER set, a server
// that is not a cluster node is an error.
func (g *Globals) redisClient(tune ...func(*rueidis.ClientOption)) (rueidis.Client, error) {
	opt, err := g.redisOptions()
	if err != nil {
		return nil, err
	}
	for _, t := range tune {
		t(&opt)
	}
	c, err := rueidis.NewClient(opt)
	if hint := authHint(err); hint != "" {
		err = fmt.Errorf("%w (%s)", err, hint)
	}
	if err != nil {
		if ms := opt.Sentinel.MasterSet; ms != "" {
			return nil, fmt.Errorf("connect to Redis master %q through the sentinels at %s: %w", ms, redactURI(g.RedisURI), err)
		}
		if len(opt.InitAddress) > 1 {
			return nil, fmt.Errorf("connect to Redis Cluster at %s: %w (several addresses in REDIS_URI name cluster seed nodes, or sentinels with REDIS_SENTINEL_MASTER)", redactURI(g.RedisURI), err)
		}
		return nil, fmt.Errorf("connect to Redis at %s: %w", redactURI(g.RedisURI), err)
	}
	if g.RedisCluster && c.Mode() != rueidis.ClientModeCluster {
		c.Close()
		return nil, fmt.Errorf("REDIS_CLUSTER is set but %s does not serve as a Redis Cluster: point REDIS_URI at the cluster's nodes, give the ACL user +cluster|slots, or unset REDIS_CLUSTER", redactURI(g.RedisURI))
	}
	return c, nil
}

// authHint says which setting to change when err is Redis refusing the
// connection's credentials (docs/deployment.md#connecting-to-redis), and
// "" for any other error.
func authHint(err error) string {
	var e *rueidis.RedisError
	if !errors.As(err, &e) {
		return ""
	}
	switch msg := e.Error(); {
	case strings.HasPrefix(msg, "NOAUTH"):
		return "the server requires a password: set REDIS_PASSWORD, and REDIS_USERNAME for an ACL user"
	case strings.HasPrefix(msg, "WRONGPASS"):
		return "the server refused these credentials: check REDIS_USERNAME and REDIS_PASSWORD"
	}
	return ""
}

// redisOptions turns the Redis settings into client options, without
// connecting. REDIS_URI takes these forms (rueidis.ParseURL, plus a comma
// list of hosts):
//
//	host:port[,host:port...]
//	redis://[user[:password]@]host[:port][,host[:port]...][/db][?option=value...]
//	rediss://...   the same over TLS
//	unix:///path/to/redis.sock
//
// Options include addr=host:port (another address), master_set=NAME (as
// REDIS_SENTINEL_MASTER), dial_timeout, write_timeout and client_name.
// REDIS_USERNAME and REDIS_PASSWORD override the URI's credentials; the
// REDIS_TLS_* files apply to rediss:// only. Every mistake is a usage error.
func (g *Globals) redisOptions() (rueidis.ClientOption, error) {
	raw := strings.TrimSpace(g.RedisURI)
	uri := raw
	if !strings.Contains(uri, "://") {
		uri = "redis://" + uri
	}
	first, more, err := splitHosts(uri)
	if err != nil {
		return rueidis.ClientOption{}, usagef("REDIS_URI %s: %v", redactURI(raw), err)
	}
	opt, err := rueidis.ParseURL(first)
	if err != nil {
		return rueidis.ClientOption{}, usagef("REDIS_URI %s: %v", redactURI(raw), err)
	}
	unix := strings.HasPrefix(uri, "unix://")
	opt.InitAddress = append(opt.InitAddress, more...)
	opt.DisableCache = true // no client-side caching: stream consumers gain nothing from it

	if g.RedisUsername != "" {
		opt.Username = g.RedisUsername
	}
	if g.RedisPassword != "" {
		opt.Password = g.RedisPassword
	}
	if opt.Username != "" && opt.Password == "" {
		return rueidis.ClientOption{}, usagef("Redis user %q has no password: add it to REDIS_URI (redis://user:password@host) or set REDIS_PASSWORD", opt.Username)
	}

	if err := g.applyTLS(&opt); err != nil {
		return rueidis.ClientOption{}, err
	}

	ms := opt.Sentinel.MasterSet
	if g.RedisSentinelMaster != "" {
		if ms != "" && ms != g.RedisSentinelMaster {
			return rueidis.ClientOption{}, usagef("REDIS_URI names master set %q (master_set=) but REDIS_SENTINEL_MASTER says %q: keep one", ms, g.RedisSentinelMaster)
		}
		ms = g.RedisSentinelMaster
	}
	switch {
	case ms != "":
		if g.RedisCluster {
			return rueidis.ClientOption{}, usagef("REDIS_CLUSTER and a Sentinel master set (%q) exclude each other: set one of them", ms)
		}
		if unix {
			return rueidis.ClientOption{}, usagef("REDIS_URI %s: sentinels are reached over TCP; list them as host:port", redactURI(raw))
		}
		opt.Sentinel = rueidis.SentinelOption{
			MasterSet: ms, Dialer: opt.Dialer, TLSConfig: opt.TLSConfig,
			Username: g.RedisSentinelUsername, Password: g.RedisSentinelPassword,
			TopologyRefreshInterval: sentinelRefresh,
		}
	case g.RedisSentinelUsername != "" || g.RedisSentinelPassword != "":
		return rueidis.ClientOption{}, usagef("REDIS_SENTINEL_USERNAME/REDIS_SENTINEL_PASSWORD are set without a master set: set REDIS_SENTINEL_MASTER too")
	case g.RedisCluster || len(opt.InitAddress) > 1:
		if unix {
			return rueidis.ClientOption{}, usagef("REDIS_URI %s: Redis Cluster is reached over TCP; list seed nodes as host:port", redactURI(raw))
		}
		if opt.SelectDB != 0 {
			return rueidis.ClientOption{}, usagef("REDIS_URI %s selects database %d, but Redis Cluster has only database 0: remove /%d", redactURI(raw), opt.SelectDB, opt.SelectDB)
		}
	}
	return opt, nil
}

// applyTLS completes the TLS settings of a rediss:// URI: the CA file
// replaces the system pool, a certificate and key authenticate the client.
// The server name is left to each connection (its own host), since a
// cluster or Sentinel connects to hosts other than the first one listed.
func (g *Globals) applyTLS(opt *rueidis.ClientOption) error {
	if opt.TLSConfig == nil {
		if g.RedisTLSCAFile != "" || g.RedisTLSCertFile != "" || g.RedisTLSKeyFile != "" {
			return usagef("REDIS_TLS_CA_FILE, REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE need TLS: use a rediss:// REDIS_URI")
		}
		return nil
	}
	opt.TLSConfig.ServerName = ""
	if g.RedisTLSCAFile != "" {
		pem, err := os.ReadFile(g.RedisTLSCAFile)
		if err != nil {
			return usagef("REDIS_TLS_CA_FILE: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return usagef("REDIS_TLS_CA_FILE %s holds no PEM certificate", g.RedisTLSCAFile)
		}
		opt.TLSConfig.RootCAs = pool
	}
	if (g.RedisTLSCertFile == "") != (g.RedisTLSKeyFile == "") {
		return usagef("REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE go together: set both for a client certificate, or neither")
	}
	if g.RedisTLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(g.RedisTLSCertFile, g.RedisTLSKeyFile)
		if err != nil {
			return usagef("client certificate REDIS_TLS_CERT_FILE/REDIS_TLS_KEY_FILE: %v", err)
		}
		opt.TLSConfig.Certificates = []tls.Certificate{cert}
	}
	return nil
}

// splitHosts takes a URI whose authority may list several hosts separated
// by commas and returns the URI with the first host only, and the other
// addresses as host:port (port 6379 when missing).
func splitHosts(uri string) (first string, more []string, err error) {
	scheme, rest, _ := strings.Cut(uri, "://")
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority, tail := rest[:end], rest[end:]
	userinfo, hosts := "", authority
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		userinfo, hosts = authority[:at+1], authority[at+1:]
	}
	list := strings.Split(hosts, ",")
	for _, h := range list[1:] {
		h = strings.TrimSpace(h)
		if h == "" {
			return "", nil, errors.New("empty address in the host list")
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), "6379")
		}
		more = append(more, h)
	}
	return scheme + "://" + userinfo + strings.TrimSpace(list[0]) + tail, more, nil
}

// redactURI hides a password in a Redis URI for messages.
func redactURI(uri string) string {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return uri
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if user, _, hasPass := strings.Cut(rest[:at], ":"); hasPass {
			return scheme + "://" + user + ":***@" + rest[at+1:]
		}
	}
	return uri
}
