// Package archtest checks the shape of the module's import graph: the core
// (package relay, the Engine and its interfaces) and the packages of pure
// types it uses link no Redis client, which lives in their redis*
// subpackages (stream/redisstream, invocation/redisstate, dlq/redisdlq,
// schedule/redisschedule, stats/redisstats) and in package worker, the
// one-call entry point that wires them together.
package archtest

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const (
	module = "github.com/relaydev/relay"
	redis  = "github.com/redis/rueidis"
)

// redisFree are the packages that must not depend on the Redis client:
// the core, and the packages whose types it uses.
var redisFree = []string{
	module,
	module + "/stream",
	module + "/invocation",
	module + "/dlq",
	module + "/schedule",
	module + "/schedule/cron",
	module + "/stats",
}

// pkg is one package as go list reports it.
type pkg struct {
	path    string
	imports []string
	deps    []string
}

// list runs go list on patterns and returns the packages by import path.
func list(t *testing.T, patterns ...string) map[string]pkg {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	args := append([]string{"list", "-e", "-f", "{{.ImportPath}}|{{join .Imports \" \"}}|{{join .Deps \" \"}}"}, patterns...)
	out, err := exec.Command(goTool, args...).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	pkgs := map[string]pkg{}
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		parts := strings.SplitN(strings.TrimSpace(line), "|", 3)
		if len(parts) != 3 {
			t.Fatalf("go list: unexpected line %q", line)
		}
		pkgs[parts[0]] = pkg{path: parts[0], imports: strings.Fields(parts[1]), deps: strings.Fields(parts[2])}
	}
	return pkgs
}

func isRedis(path string) bool { return path == redis || strings.HasPrefix(path, redis+"/") }

// TestCoreLinksNoRedis fails when package relay, or a package of pure
// types it uses, depends on rueidis, naming the module's packages that
// import it on the way.
func TestCoreLinksNoRedis(t *testing.T) {
	pkgs := list(t, redisFree...)
	var deps map[string]pkg // the deps' own imports, read on a failure
	for _, path := range redisFree {
		p, ok := pkgs[path]
		if !ok {
			t.Errorf("go list did not report %s", path)
			continue
		}
		if !slices.ContainsFunc(p.deps, isRedis) {
			continue
		}
		if deps == nil {
			deps = list(t, p.deps...)
		}
		// The packages of the module among path and its deps that import
		// the client directly.
		var culprits []string
		for _, d := range append([]string{path}, p.deps...) {
			dp, ok := deps[d]
			if d == path {
				dp, ok = p, true
			}
			if ok && strings.HasPrefix(d, module) && slices.ContainsFunc(dp.imports, isRedis) {
				culprits = append(culprits, d)
			}
		}
		t.Errorf("%s depends on %s, imported by %v: keep Redis code in the redis* subpackages (docs/embedding.md)", path, redis, culprits)
	}
}

// TestPureImportsNoRedisSubpackage: a pure package never imports a Redis
// implementation, its own or another's (which would also pull in rueidis).
func TestPureImportsNoRedisSubpackage(t *testing.T) {
	pkgs := list(t, redisFree...)
	for _, path := range redisFree {
		for _, d := range pkgs[path].deps {
			if !strings.HasPrefix(d, module+"/") {
				continue
			}
			for _, elem := range strings.Split(strings.TrimPrefix(d, module+"/"), "/") {
				if strings.HasPrefix(elem, "redis") {
					t.Errorf("%s depends on %s, a Redis implementation", path, d)
				}
			}
		}
	}
}
