#!/usr/bin/env bash
# make demo: installs what is missing, starts redis-server and containerd
# under .state/, builds relay, runs a worker on examples/apps, publishes
# sample events with redis-cli and shows the handlers' output and the DLQ.
# Stops on exit only what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
export STATE_DIR=${STATE_DIR:-$PWD/.state}
bash scripts/setup.sh
source scripts/services.sh
use_go

worker_pid=""
cleanup() {
	if [ -n "$worker_pid" ] && kill -0 "$worker_pid" 2>/dev/null; then
		kill -TERM "$worker_pid" 2>/dev/null || true
		wait "$worker_pid" 2>/dev/null || true
	fi
	services_stop
}
trap cleanup EXIT
services_start redis containerd
# --- runtime images for the orders (python3) and products (node) apps:
# relay.local/python3:bookworm and relay.local/node:bookworm, built from
# Debian packages by scripts/runtime-images.sh (a few minutes the first
# time, cached under $STATE_DIR/images) and imported into containerd.
echo "demo: runtime images"
scripts/runtime-images.sh "$STATE_DIR" "$CONTAINERD_ADDRESS" python3 >/dev/null
scripts/runtime-images.sh "$STATE_DIR" "$CONTAINERD_ADDRESS" node >/dev/null
# --- end runtime images

echo "demo: building relay"
mkdir -p "$STATE_DIR/bin" "$STATE_DIR/demo"
go build -o "$STATE_DIR/bin/relay" ./cmd/relay
CGO_ENABLED=0 go build -o "$STATE_DIR/bin/relay-exec" ./cmd/relay-exec
relay="$STATE_DIR/bin/relay"

# A fresh stream per run: the output shows this run only, and nothing that
# was already in Redis is touched.
export REDIS_URI="127.0.0.1:$RELAY_REDIS_PORT" REDIS_STREAM="relay-demo-$(date +%s)" REDIS_GROUP=relay-demo
export RELAY_APPS="$PWD/examples/apps" RELAY_STATE_DIR="$STATE_DIR/relay" RELAY_CONSUMER=demo-worker
export CONTAINERD_NAMESPACE=relay
# make console shows the newest demo run's stream.
echo "$REDIS_STREAM" >"$STATE_DIR/demo/stream"
rcli() { redis-cli -p "$RELAY_REDIS_PORT" "$@"; }

# The notify app's secret (docs/apps.md "Secrets"): a random value in a
# directory of the demo, mounted at /run/secrets/smtp-password.
export RELAY_SECRETS_DIR="$STATE_DIR/demo/secrets"
mkdir -p "$RELAY_SECRETS_DIR"
chmod 700 "$RELAY_SECRETS_DIR"
[ -s "$RELAY_SECRETS_DIR/smtp-password" ] || head -c 12 /dev/urandom | base64 >"$RELAY_SECRETS_DIR/smtp-password"
# The inventory app's npm dependency is installed from the npm registry
# (npm_config_registry for a mirror). Behind a TLS-inspecting proxy, the
# host's CA bundle is what builds must trust.
if [ -z "${RELAY_BUILD_CA_FILE:-}" ] && [ -n "${NODE_EXTRA_CA_CERTS:-}" ] && [ -f "$NODE_EXTRA_CA_CERTS" ]; then
	export RELAY_BUILD_CA_FILE=$NODE_EXTRA_CA_CERTS
fi

echo "demo: relay validate"
"$relay" validate --secrets-dir "$RELAY_SECRETS_DIR"

# start_worker LOG: runs relay start in the background, logging to LOG,
# and waits until it serves every app. The first start builds the
# inventory app's dependency image (npm ci): the worker serves the other
# apps meanwhile and the inventory app once it is built (logged as "app
# being prepared", then "app loaded"); later starts reuse the image.
start_worker() {
	"$relay" start >"$1" 2>&1 &
	worker_pid=$!
	for _ in $(seq 1 3000); do
		grep -q "worker started" "$1" && all_prepared "$1" && return 0
		kill -0 "$worker_pid" 2>/dev/null || { cat "$1"; echo "demo: worker exited" >&2; exit 1; }
		sleep 0.1
	done
	cat "$1"
	echo "demo: worker did not serve every app within 5 minutes" >&2
	exit 1
}
# all_prepared LOG: whether every app LOG shows as being prepared has
# since been loaded, or found not ready.
all_prepared() {
	local app
	for app in $(sed -nE 's/.*msg="app being prepared[^"]*" app=([^ ]+).*/\1/p' "$1" | sort -u); do
		grep -qE "msg=\"(app loaded|app unavailable: not ready)\" app=$app( |\$)" "$1" || return 1
	done
}
stop_worker() {
	kill -TERM "$worker_pid"
	wait "$worker_pid" || true
	worker_pid=""
}

log="$STATE_DIR/demo/worker.log"
echo "demo: starting the worker (the first run builds the inventory app's dependencies)"
start_worker "$log"

echo
echo "demo: publishing events"
# redis-cli itself, not rcli: xtrace shows a function's call and then each
# command in it, so every event would show twice.
set -x
redis-cli -p "$RELAY_REDIS_PORT" XADD "$REDIS_STREAM" '*' event '{"event_name":"INSERT","table_name":"users","new_image":{"id":42,"email":"ada@example.com"}}'
redis-cli -p "$RELAY_REDIS_PORT" XADD "$REDIS_STREAM" '*' event '{"event_name":"INSERT","table_name":"audit_log"}'
redis-cli -p "$RELAY_REDIS_PORT" XADD "$REDIS_STREAM" '*' event 'this is not JSON'
redis-cli -p "$RELAY_REDIS_PORT" XADD "$REDIS_STREAM" '*' event '{"event_name":"INSERT","table_name":"invoices","new_image":{"id":7,"amount":120}}'
redis-cli -p "$RELAY_REDIS_PORT" XADD "$REDIS_STREAM" '*' event '{"event_name":"UPDATE","table_name":"invoices","new_image":{"id":8,"amount":5000}}'
redis-cli -p "$RELAY_REDIS_PORT" XADD "$REDIS_STREAM" '*' event '{"event_name":"INSERT","table_name":"invoice_mails","new_image":{"invoice":7,"to":"ada@example.com"}}'
# runtime apps: orders (Python) and products (Node)
redis-cli -p "$RELAY_REDIS_PORT" XADD "$REDIS_STREAM" '*' event '{"event_name":"INSERT","table_name":"orders","new_image":{"id":1001,"items":3,"total":59.9}}'
redis-cli -p "$RELAY_REDIS_PORT" XADD "$REDIS_STREAM" '*' event '{"event_name":"UPDATE","table_name":"orders","new_image":{"id":1001,"status":"SHIPPED","carrier":"DHL"}}'
redis-cli -p "$RELAY_REDIS_PORT" XADD "$REDIS_STREAM" '*' event '{"event_name":"INSERT","table_name":"products","new_image":{"id":"sku-1","name":"Desk lamp"}}'
# an npm dependency (inventory, Node) and a mounted secret (notify, Python)
redis-cli -p "$RELAY_REDIS_PORT" XADD "$REDIS_STREAM" '*' event '{"event_name":"UPDATE","table_name":"stock","new_image":{"sku":"sku-1","quantity":2,"restock_in":"2 days"}}'
redis-cli -p "$RELAY_REDIS_PORT" XADD "$REDIS_STREAM" '*' event '{"event_name":"INSERT","table_name":"signups","new_image":{"email":"ada@example.com"}}'
{ set +x; } 2>/dev/null

# Wait until every entry was delivered and acknowledged.
last=$(rcli XREVRANGE "$REDIS_STREAM" + - COUNT 1 | head -n1)
settled() {
	[ "$(rcli XPENDING "$REDIS_STREAM" relay-demo | head -n1)" = 0 ] || return 1
	local delivered
	delivered=$(rcli XINFO GROUPS "$REDIS_STREAM" | awk 'prev=="last-delivered-id"{print} {prev=$0}')
	[ "$delivered" = "$last" ]
}
for _ in $(seq 1 600); do
	settled && break
	kill -0 "$worker_pid" 2>/dev/null || { cat "$log"; echo "demo: worker exited" >&2; exit 1; }
	sleep 0.1
done
settled || { cat "$log"; echo "demo: events were not all acknowledged within 60s" >&2; exit 1; }
stop_worker

# A second start finds the dependency image built by the first.
log2="$STATE_DIR/demo/worker-restart.log"
start_worker "$log2"
stop_worker

echo
echo "== handler output (each line prefixed [app/handler]) =="
grep -E '^\[[a-z0-9._-]+/[^]]+\] ' "$log" || true
echo
echo "== worker log =="
grep -vE '^\[[a-z0-9._-]+/[^]]+\] ' "$log" | sed -E 's/^time=[^ ]+ //'
echo
echo "== second start: dependency images =="
grep -E 'dependency' "$log2" | sed -E 's/^time=[^ ]+ //'
echo
echo "== pending entries (XPENDING) =="
rcli XPENDING "$REDIS_STREAM" relay-demo | head -n1
echo
echo "== dead-letter queue (relay dlq ls) =="
"$relay" dlq ls
echo
echo "demo: done; the full worker log is $log"
echo "demo: to look at this run in the browser (replay the dead letters, test patterns), run: make console"
