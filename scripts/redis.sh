#!/usr/bin/env bash
# scripts/redis.sh start|stop|status STATE_DIR [PORT]
# Runs a private redis-server on 127.0.0.1:PORT (default 6390) with its data,
# log and pid file under STATE_DIR/redis. stop ends only the PID it started.
set -euo pipefail
cmd=${1:?usage: redis.sh start|stop|status STATE_DIR [PORT]}
state=${2:?usage: redis.sh start|stop|status STATE_DIR [PORT]}
port=${3:-6390}
mkdir -p "$state/redis"
# Absolute paths: redis-server changes into --dir before writing its pid file.
dir=$(cd "$state/redis" && pwd)
pidf="$dir/redis.pid"

running() { [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null; }

case "$cmd" in
start)
	if running; then
		echo "redis: already running (pid $(cat "$pidf")) on 127.0.0.1:$port"
		exit 0
	fi
	if redis-cli -p "$port" ping >/dev/null 2>&1; then
		echo "redis: port $port is already used by another server; set RELAY_REDIS_PORT to a free port" >&2
		exit 1
	fi
	redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly yes \
		--daemonize yes --pidfile "$pidf" --logfile "$dir/redis.log" >/dev/null
	for _ in $(seq 1 100); do
		if running && redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then
			echo "redis: running (pid $(cat "$pidf")) on 127.0.0.1:$port"
			exit 0
		fi
		sleep 0.1
	done
	echo "redis: did not answer PING on port $port; see $dir/redis.log" >&2
	tail -5 "$dir/redis.log" >&2 || true
	exit 1
	;;
stop)
	if running; then
		pid=$(cat "$pidf")
		kill "$pid"
		for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null || true
		echo "redis: stopped (pid $pid)"
	fi
	rm -f "$pidf"
	;;
status)
	running && echo "redis: running (pid $(cat "$pidf"))" || { echo "redis: stopped"; exit 1; }
	;;
*) echo "usage: redis.sh start|stop|status STATE_DIR [PORT]" >&2; exit 2 ;;
esac
