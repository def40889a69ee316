#!/usr/bin/env bash
# Sourced by demo.sh and test.sh. services_start NAME... starts redis and/or
# containerd under $STATE_DIR unless already running (and imports the example
# image into containerd); services_stop stops only what services_start
# started, by the PIDs the scripts recorded.
: "${STATE_DIR:?}"
export RELAY_REDIS_PORT=${RELAY_REDIS_PORT:-6390}
export CONTAINERD_ADDRESS="$STATE_DIR/containerd/containerd.sock"
_started=()

services_stop() {
	local i
	for ((i = ${#_started[@]} - 1; i >= 0; i--)); do
		case "${_started[$i]}" in
		redis) scripts/redis.sh stop "$STATE_DIR" "$RELAY_REDIS_PORT" || true ;;
		containerd) scripts/containerd.sh stop "$STATE_DIR" || true ;;
		esac
	done
	_started=()
}

services_start() {
	local s
	for s in "$@"; do
		case "$s" in
		redis)
			if ! scripts/redis.sh status "$STATE_DIR" >/dev/null 2>&1; then
				_started+=(redis)
				scripts/redis.sh start "$STATE_DIR" "$RELAY_REDIS_PORT"
			fi
			;;
		containerd)
			if ! scripts/containerd.sh status "$STATE_DIR" >/dev/null 2>&1; then
				_started+=(containerd)
				scripts/containerd.sh start "$STATE_DIR"
			fi
			RELAY_TEST_IMAGE_ARCHIVE=$(scripts/images.sh "$STATE_DIR" "$CONTAINERD_ADDRESS" | tail -n1)
			export RELAY_TEST_IMAGE_ARCHIVE
			;;
		esac
	done
}

# use_go puts the Go toolchain that setup.sh chose first on PATH.
use_go() {
	if [ -x "$STATE_DIR/go/bin/go" ]; then
		export PATH="$STATE_DIR/go/bin:$PATH"
	elif ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
		export PATH="/usr/local/go/bin:$PATH"
	fi
}
