#!/usr/bin/env bash
# scripts/sentinel.sh start|stop|status|kill-master STATE_DIR [BASE_PORT]
#
# Runs a private Sentinel-managed Redis on loopback for Relay's failover
# tests and development: a master on BASE_PORT (default 7100), a replica on
# BASE_PORT+1 and three sentinels on BASE_PORT+2..+4 that monitor the
# master set SENTINEL_MASTER (default "relay") with quorum 2. Each process
# keeps its config, data, log and pid file under STATE_DIR/sentinel/<port>.
#
# start is idempotent; it waits until the replica is in sync and every
# sentinel knows the other two and the replica (so a failover can happen),
# and prints the sentinel addresses on its last stdout line:
#
#   127.0.0.1:7102,127.0.0.1:7103,127.0.0.1:7104
#
# kill-master asks a sentinel which node is the master now, SIGKILLs that
# node by its pid file and prints its port. stop ends only the PIDs in the
# pid files, each checked to be a redis-server on its port.
#
# SENTINEL_DOWN_AFTER_MS (default 2000) is how long the master must be
# unreachable before it is declared down; SENTINEL_FAILOVER_TIMEOUT_MS
# (default 10000) bounds a failover attempt.
set -euo pipefail

usage() {
	echo "usage: $0 start|stop|status|kill-master STATE_DIR [BASE_PORT]" >&2
	exit 2
}
[[ $# -ge 2 && $# -le 3 ]] || usage
cmd=$1
state=$2
base=${3:-7100}
if ! [[ $base =~ ^[0-9]+$ ]] || ((base < 1 || base + 4 > 65535)); then
	echo "sentinel: BASE_PORT must be a number from 1 to 65531" >&2
	exit 2
fi
master_set=${SENTINEL_MASTER:-relay}
down_after=${SENTINEL_DOWN_AFTER_MS:-2000}
failover_timeout=${SENTINEL_FAILOVER_TIMEOUT_MS:-10000}
data_ports=("$base" "$((base + 1))")
sentinel_ports=("$((base + 2))" "$((base + 3))" "$((base + 4))")
mkdir -p "$state/sentinel"
# Absolute paths: redis-server changes into its dir before writing files.
root=$(cd "$state/sentinel" && pwd)


# dir_of, rcli, running_pid and stop_nodes.
# shellcheck source=scripts/redis-nodes.sh
source "$(dirname "$0")/redis-nodes.sh"

port_free() {
	if rcli "$1" ping >/dev/null 2>&1; then
		echo "sentinel: port $1 is already used by another server; choose another BASE_PORT" >&2
		exit 1
	fi
}

start_data() {
	local port=$1 dir
	dir=$(dir_of "$port")
	running_pid "$port" >/dev/null && return 0
	port_free "$port"
	mkdir -p "$dir"
	local args=(--port "$port" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no
		--daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log")
	# The replica follows the master only on its first start: after a
	# failover the sentinels own the roles and rewrite them.
	if [[ $port != "$base" && ! -f $dir/started ]]; then
		args+=(--replicaof 127.0.0.1 "$base")
	fi
	redis-server "${args[@]}" >/dev/null
	touch "$dir/started"
}

start_sentinel() {
	local port=$1 dir conf
	dir=$(dir_of "$port")
	conf=$dir/sentinel.conf
	running_pid "$port" >/dev/null && return 0
	port_free "$port"
	mkdir -p "$dir"
	# Sentinel rewrites its config file with what it learns; write it once.
	if [[ ! -f $conf ]]; then
		cat >"$conf" <<CONF
port $port
bind 127.0.0.1
dir $dir
daemonize yes
pidfile $dir/redis.pid
logfile $dir/redis.log
sentinel monitor $master_set 127.0.0.1 $base 2
sentinel down-after-milliseconds $master_set $down_after
sentinel failover-timeout $master_set $failover_timeout
sentinel parallel-syncs $master_set 1
CONF
	fi
	redis-server "$conf" --sentinel >/dev/null
}

wait_ping() {
	local port=$1
	for _ in $(seq 1 100); do
		if running_pid "$port" >/dev/null && rcli "$port" ping 2>/dev/null | grep -q PONG; then
			return 0
		fi
		sleep 0.1 # poll interval
	done
	echo "sentinel: $port did not answer PING; last log lines:" >&2
	tail -5 "$(dir_of "$port")/redis.log" >&2 || true
	exit 1
}

# master_port asks the first sentinel that answers for the master's port.
master_port() {
	local s out
	for s in "${sentinel_ports[@]}"; do
		if out=$(rcli "$s" sentinel get-master-addr-by-name "$master_set" 2>/dev/null | tr -d '\r') && [[ -n $out ]]; then
			echo "$out" | sed -n 2p
			return 0
		fi
	done
	return 1
}

field() { tr -d '\r' | sed -n "s/^$1://p"; }

# ready: the replica of the current master is in sync and every sentinel
# sees one replica and two other sentinels.
ready() {
	local m s
	m=$(master_port) || return 1
	[[ $(rcli "$m" info replication 2>/dev/null | field connected_slaves) == 1 ]] || return 1
	for s in "${sentinel_ports[@]}"; do
		[[ $(rcli "$s" sentinel master "$master_set" 2>/dev/null | tr -d '\r' | awk 'p{print; exit} $0=="num-other-sentinels"{p=1}') == 2 ]] || return 1
		[[ $(rcli "$s" sentinel master "$master_set" 2>/dev/null | tr -d '\r' | awk 'p{print; exit} $0=="num-slaves"{p=1}') -ge 1 ]] || return 1
	done
	for s in "${data_ports[@]}"; do
		if [[ $s != "$m" ]] && [[ $(rcli "$s" info replication 2>/dev/null | field master_link_status) != up ]]; then
			return 1
		fi
	done
}

sentinels() {
	local IFS=,
	local list=()
	for p in "${sentinel_ports[@]}"; do list+=("127.0.0.1:$p"); done
	echo "${list[*]}"
}

start() {
	command -v redis-server >/dev/null || { echo "sentinel: redis-server not found (apt-get install redis-server)" >&2; exit 1; }
	command -v redis-cli >/dev/null || { echo "sentinel: redis-cli not found (apt-get install redis-tools)" >&2; exit 1; }
	local p
	for p in "${data_ports[@]}"; do start_data "$p"; done
	for p in "${data_ports[@]}"; do wait_ping "$p"; done
	for p in "${sentinel_ports[@]}"; do start_sentinel "$p"; done
	for p in "${sentinel_ports[@]}"; do wait_ping "$p"; done
	# Sentinels find each other through hello messages every 2s.
	for _ in $(seq 1 600); do
		if ready; then
			echo "sentinel: master set $master_set, master on $(master_port), sentinels on ${sentinel_ports[*]} ($root)" >&2
			sentinels
			return 0
		fi
		sleep 0.1 # poll interval
	done
	echo "sentinel: the topology was not ready after 60s (replica in sync, sentinels aware of each other)" >&2
	exit 1
}

kill_master() {
	local m pid
	m=$(master_port) || { echo "sentinel: no sentinel answers" >&2; exit 1; }
	pid=$(running_pid "$m") || { echo "sentinel: the master on port $m is not running" >&2; exit 1; }
	kill -KILL "$pid"
	for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
	echo "sentinel: killed the master on port $m (pid $pid)" >&2
	echo "$m"
}

stop() { stop_nodes "sentinel: stopped" "${sentinel_ports[@]}" "${data_ports[@]}"; }

status() {
	local p pid rc=0
	for p in "${data_ports[@]}" "${sentinel_ports[@]}"; do
		if pid=$(running_pid "$p"); then
			echo "$p: running pid=$pid"
		else
			echo "$p: stopped"
			rc=1
		fi
	done
	if m=$(master_port); then echo "master: 127.0.0.1:$m"; fi
	return $rc
}

case $cmd in
start) start ;;
stop) stop ;;
status) status ;;
kill-master) kill_master ;;
*) usage ;;
esac
