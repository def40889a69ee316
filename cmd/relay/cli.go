package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"syscall"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"

	"github.com/alecthomas/kong"
	"github.com/redis/rueidis"
)

// Exit codes (docs/operations.md#commands).
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// Globals are the flags every command shares, with the env fallbacks of
// docs/operations.md#configuration.
type Globals struct {
	RedisURI    string `name:"redis-uri" env:"REDIS_URI" help:"Redis address: host:port, redis://[user:pass@]host:port[,host:port...][/db] or rediss:// for TLS; several addresses are Redis Cluster seed nodes, or sentinels with --redis-sentinel-master." group:"redis"`
	RedisStream string `name:"stream" env:"REDIS_STREAM" help:"Source stream; relay start also takes a comma list." group:"redis"`
	RedisGroup  string `name:"group" env:"REDIS_GROUP" help:"Consumer group." group:"redis"`
	Apps        string `name:"apps" env:"RELAY_APPS" default:"/apps" help:"Apps root: one directory with a template.yaml per app."`
	LogLevel    string `name:"log-level" env:"LOG_LEVEL" default:"info" enum:"debug,info,warn,error" help:"Log level: debug, info, warn or error." group:"logging"`
	LogFormat   string `name:"log-format" env:"LOG_FORMAT" default:"text" enum:"text,json" help:"Log format: text or json." group:"logging"`

	// Redis connection modes, TLS and ACL (redis.go, docs/deployment.md).
	RedisCluster          bool   `name:"redis-cluster" env:"REDIS_CLUSTER" help:"Require Redis Cluster: REDIS_URI lists seed nodes and every stream needs a hash tag such as {orders}." group:"redis"`
	RedisSentinelMaster   string `name:"redis-sentinel-master" env:"REDIS_SENTINEL_MASTER" help:"Sentinel master set name; REDIS_URI then lists the sentinels." group:"redis"`
	RedisUsername         string `name:"redis-username" env:"REDIS_USERNAME" help:"Redis ACL user (overrides the URI's)." group:"redis"`
	RedisPassword         string `name:"redis-password" env:"REDIS_PASSWORD" help:"Password of the ACL user or of requirepass (overrides the URI's); prefer the env variable." group:"redis"`
	RedisSentinelUsername string `name:"redis-sentinel-username" env:"REDIS_SENTINEL_USERNAME" help:"ACL user on the sentinels, when they require one." group:"redis"`
	RedisSentinelPassword string `name:"redis-sentinel-password" env:"REDIS_SENTINEL_PASSWORD" help:"Password on the sentinels; prefer the env variable." group:"redis"`
	RedisTLSCAFile        string `name:"redis-tls-ca-file" env:"REDIS_TLS_CA_FILE" help:"PEM CA bundle that signs the servers' certificates (rediss:// only; default: the system pool)." group:"redis"`
	RedisTLSCertFile      string `name:"redis-tls-cert-file" env:"REDIS_TLS_CERT_FILE" help:"PEM client certificate for servers that require one (rediss:// only)." group:"redis"`
	RedisTLSKeyFile       string `name:"redis-tls-key-file" env:"REDIS_TLS_KEY_FILE" help:"PEM key of REDIS_TLS_CERT_FILE." group:"redis"`

	stdout, stderr io.Writer
	// appsSet is set when --apps or RELAY_APPS gave the apps root, rather
	// than its default (appsGiven).
	appsSet bool
}

// appsGiven reports whether kctx's command line or the environment set
// the apps root: relay health checks the templates of a root it was told
// about, and of the default one only when it exists.
func appsGiven(kctx *kong.Context) bool {
	if _, ok := os.LookupEnv("RELAY_APPS"); ok {
		return true
	}
	for _, p := range kctx.Path {
		if p.Flag != nil && p.Flag.Name == "apps" {
			return true
		}
	}
	return false
}

// CLI is the root command.
type CLI struct {
	Globals

	Start    StartCmd    `cmd:"" help:"Run a worker in the foreground until SIGINT or SIGTERM."`
	Validate ValidateCmd `cmd:"" help:"Load the apps root and print every template error; exit 1 on any."`
	Match    MatchCmd    `cmd:"" help:"Print the app/handler targets an event would run, in dispatch order; --explain says why, --backtest N counts what each rule matches among the stream's newest N entries."`
	DLQ      DLQCmd      `cmd:"" name:"dlq" help:"Inspect the dead-letter queue."`
	App      AppCmd      `cmd:"" help:"List, inspect and manually invoke apps."`
	Health   HealthCmd   `cmd:"" help:"Check that Redis (stream and group) and containerd are usable; exit 1 naming what is not."`
	Stats    StatsCmd    `cmd:"" help:"Show the cluster-wide counters, the pending entries, the DLQ length and the Redis memory budget."`
	Console  ConsoleCmd  `cmd:"" help:"Serve the web console: pipeline overview, apps, pending, DLQ, pattern playground, live outcomes."`
	Publish  PublishCmd  `cmd:"" help:"Publish events to the stream (an argument, stdin, or a newline-delimited JSON file), printing their ids."`
}

// usageError marks an error as the caller's (exit 2).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

type exitCode int

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	var cli CLI
	cli.stdout, cli.stderr = stdout, stderr
	defer func() {
		if r := recover(); r != nil {
			c, ok := r.(exitCode)
			if !ok {
				panic(r)
			}
			code = int(c)
		}
	}()
	parser, err := kong.New(&cli,
		kong.Name("relay"),
		kong.Description("Relay runs containerised handlers for events in a Redis Stream."),
		kong.Writers(stdout, stderr),
		kong.Exit(func(c int) { panic(exitCode(c)) }),
		kong.BindTo(ctx, (*context.Context)(nil)),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		// A command's own flags come first; the shared connection and
		// logging flags follow under their own headings.
		kong.ExplicitGroups([]kong.Group{
			{Key: "redis", Title: "Redis connection (env REDIS_*; see docs/deployment.md):"},
			{Key: "logging", Title: "Logging:"},
		}),
	)
	if err != nil {
		fmt.Fprintf(stderr, "relay: %v\n", err)
		return exitFailure
	}
	kctx, err := parser.Parse(args)
	if errors.Is(err, syscall.EPIPE) {
		return exitOK // the reader of --help went away (| head): nothing to report
	}
	if err != nil {
		fmt.Fprintf(stderr, "relay: %v\n", err)
		var pe *kong.ParseError
		if errors.As(err, &pe) && pe.Context != nil {
			fmt.Fprintf(stderr, "Run \"%s --help\" for usage.\n", strings.TrimSpace("relay "+pe.Context.Command()))
		}
		return exitUsage
	}
	cli.appsSet = appsGiven(kctx)
	if err := kctx.Run(&cli.Globals); err != nil {
		if closedOutput(err) {
			// The reader of the output went away (| head): nothing to
			// report, but what was cut short may not have been done, so
			// not success either (as a shell's SIGPIPE status).
			return exitFailure
		}
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "relay: %v\n", err)
			return exitUsage
		}
		var silent silentError
		if !errors.As(err, &silent) {
			// Library errors carry their own "relay: " prefix.
			fmt.Fprintf(stderr, "relay: %s\n", strings.TrimPrefix(err.Error(), "relay: "))
		}
		return exitFailure
	}
	return exitOK
}

// closedOutput reports whether err is a write to a file, such as standard
// output, whose reader has gone (EPIPE): not a network connection's, which
// is a real failure.
func closedOutput(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe) && errors.Is(pe.Err, syscall.EPIPE)
}

// silentError is a failure whose details the command already printed.
type silentError struct{ error }

func (g *Globals) logger() *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(g.LogLevel)) // kong's enum already checked it
	opts := &slog.HandlerOptions{Level: level}
	if g.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(g.stderr, opts))
	}
	return slog.New(slog.NewTextHandler(g.stderr, opts))
}

// requireStream checks the settings every Redis-backed command needs; the
// consumer group only when needGroup.
func (g *Globals) requireStream(needGroup bool) error {
	if err := g.requireRedis(needGroup); err != nil {
		return err
	}
	// Only relay start consumes a list (startStreams); the other commands
	// read one stream's DLQ, stats or group.
	streams, err := g.streamNames()
	if err != nil {
		return err
	}
	if len(streams) > 1 {
		return usagef("REDIS_STREAM names %d streams (%s); only relay start takes a list: pass --stream with one of them", len(streams), strings.Join(streams, ", "))
	}
	return nil
}

// requireRedis names every missing setting of REDIS_URI, REDIS_STREAM and,
// when needGroup, REDIS_GROUP in one usage error.
func (g *Globals) requireRedis(needGroup bool) error {
	var missing []string
	if g.RedisURI == "" {
		missing = append(missing, "REDIS_URI (--redis-uri)")
	}
	if g.RedisStream == "" {
		missing = append(missing, "REDIS_STREAM (--stream)")
	}
	if needGroup && g.RedisGroup == "" {
		missing = append(missing, "REDIS_GROUP (--group)")
	}
	if len(missing) > 0 {
		return usagef("missing required configuration: %s", strings.Join(missing, ", "))
	}
	return nil
}

// loadApps loads the apps root, pointing at the setting when it is missing.
func (g *Globals) loadApps(opts ...template.Option) (*app.Set, error) {
	apps, err := template.LoadDir(g.Apps, opts...)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w (set RELAY_APPS or --apps to the directory holding your apps)", err)
	}
	return apps, err
}

// streamClient connects to Redis and checks that REDIS_STREAM exists
// (checkStream); the caller closes the client.
func (g *Globals) streamClient(ctx context.Context) (rueidis.Client, error) {
	rc, err := g.redisClient()
	if err != nil {
		return nil, err
	}
	if err := g.checkStream(ctx, rc); err != nil {
		rc.Close()
		return nil, err
	}
	return rc, nil
}

// checkStream fails when the source stream does not exist: a mistyped
// REDIS_STREAM would otherwise read as an empty DLQ, "all clear".
func (g *Globals) checkStream(ctx context.Context, rc rueidis.Client) error {
	n, err := rc.Do(ctx, rc.B().Exists().Key(g.RedisStream).Build()).AsInt64()
	if err != nil {
		return fmt.Errorf("redis at %s: %w", redactURI(g.RedisURI), err)
	}
	if n == 0 {
		return fmt.Errorf("stream %q does not exist on %s: check REDIS_STREAM (--stream)", g.RedisStream, redactURI(g.RedisURI))
	}
	return nil
}

// errNoApps is returned by commands that would be meaningless, or
// dangerous, with an empty apps root: a worker with no rules acknowledges
// every event as unmatched.
func errNoApps(root string) error {
	return fmt.Errorf("no apps in %s (no directory there holds a %s); is RELAY_APPS (--apps) right?", root, app.TemplateFile)
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "relay"
	}
	return h
}
