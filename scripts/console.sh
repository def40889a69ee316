#!/usr/bin/env bash
# make console: serves relay console on the demo's state (docs/console.md):
# starts redis-server and containerd under STATE_DIR when they are not
# running (the demo's Redis keeps its data in an append-only file), builds
# relay and runs `relay console` in the foreground on the newest demo run's
# stream, with the example apps, until Ctrl-C; then stops only what it
# started. REDIS_STREAM overrides the stream; RELAY_CONSOLE_LISTEN the
# address (default 127.0.0.1:8089).
set -euo pipefail
cd "$(dirname "$0")/.."
export STATE_DIR=${STATE_DIR:-$PWD/.state}
bash scripts/setup.sh
source scripts/services.sh
use_go
trap services_stop EXIT
services_start redis containerd
# The orders (python3) and products (node) apps need their images for a
# replay; cached under STATE_DIR/images after the first demo.
scripts/runtime-images.sh "$STATE_DIR" "$CONTAINERD_ADDRESS" python3 >/dev/null
scripts/runtime-images.sh "$STATE_DIR" "$CONTAINERD_ADDRESS" node >/dev/null

if [ -z "${REDIS_STREAM:-}" ]; then
	if [ ! -s "$STATE_DIR/demo/stream" ]; then
		echo "console: no demo run found under $STATE_DIR; run make demo first, or set REDIS_STREAM" >&2
		exit 1
	fi
	REDIS_STREAM=$(cat "$STATE_DIR/demo/stream")
fi
mkdir -p "$STATE_DIR/bin"
go build -o "$STATE_DIR/bin/relay" ./cmd/relay
export REDIS_URI="127.0.0.1:$RELAY_REDIS_PORT" REDIS_STREAM REDIS_GROUP=${REDIS_GROUP:-relay-demo}
export RELAY_APPS=${RELAY_APPS:-$PWD/examples/apps} CONTAINERD_NAMESPACE=relay
echo "console: stream $REDIS_STREAM, group $REDIS_GROUP; Ctrl-C stops it"
# Not exec: the trap must stop the services this script started.
"$STATE_DIR/bin/relay" console --listen "${RELAY_CONSOLE_LISTEN:-127.0.0.1:8089}" || true
