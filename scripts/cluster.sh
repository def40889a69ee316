#!/usr/bin/env bash
# scripts/cluster.sh start|stop|status STATE_DIR [BASE_PORT]
#
# Runs a private 3-master Redis Cluster on 127.0.0.1:BASE_PORT, BASE_PORT+1
# and BASE_PORT+2 (default 7000; cluster bus ports are 10000 higher), for
# Relay's cluster tests, benchmarks and development. Each node keeps its
# data, log, nodes.conf and pid file under STATE_DIR/cluster/<port>.
#
# start is idempotent: running nodes are reused, missing ones started, and
# the slots are assigned with `redis-cli --cluster create` only when the
# nodes do not form a cluster yet. It waits until every node reports
# cluster_state:ok and prints the seed list on its last stdout line:
#
#   127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002
#
# stop ends only the PIDs in the pid files, each checked to be a
# redis-server on its port. CLUSTER_NODE_TIMEOUT_MS sets cluster-node-timeout
# (default 2000).
set -euo pipefail

usage() {
	echo "usage: $0 start|stop|status STATE_DIR [BASE_PORT]" >&2
	exit 2
}
[[ $# -ge 2 && $# -le 3 ]] || usage
cmd=$1
state=$2
base=${3:-7000}
if ! [[ $base =~ ^[0-9]+$ ]] || ((base < 1 || base + 10002 > 65535)); then
	echo "cluster: BASE_PORT must be a number from 1 to 55533" >&2
	exit 2
fi
ports=("$base" "$((base + 1))" "$((base + 2))")
node_timeout=${CLUSTER_NODE_TIMEOUT_MS:-2000}
mkdir -p "$state/cluster"
# Absolute paths: redis-server changes into --dir before writing its pid file.
root=$(cd "$state/cluster" && pwd)


# dir_of, rcli, running_pid and stop_nodes.
# shellcheck source=scripts/redis-nodes.sh
source "$(dirname "$0")/redis-nodes.sh"


start_node() {
	local port=$1 dir
	dir=$(dir_of "$port")
	if running_pid "$port" >/dev/null; then
		return 0
	fi
	if rcli "$port" ping >/dev/null 2>&1; then
		echo "cluster: port $port is already used by another server; choose another BASE_PORT" >&2
		exit 1
	fi
	mkdir -p "$dir"
	redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no \
		--cluster-enabled yes --cluster-config-file "$dir/nodes.conf" --cluster-node-timeout "$node_timeout" \
		--daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
}

wait_node() {
	local port=$1
	for _ in $(seq 1 100); do
		if running_pid "$port" >/dev/null && rcli "$port" ping 2>/dev/null | grep -q PONG; then
			return 0
		fi
		sleep 0.1 # poll interval
	done
	echo "cluster: node $port did not answer PING; last log lines:" >&2
	tail -5 "$(dir_of "$port")/redis.log" >&2 || true
	exit 1
}

cluster_ok() { rcli "$1" cluster info 2>/dev/null | tr -d '\r' | grep -qx 'cluster_state:ok'; }
known_nodes() { rcli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_known_nodes://p'; }

seeds() {
	local IFS=,
	local list=()
	for p in "${ports[@]}"; do list+=("127.0.0.1:$p"); done
	echo "${list[*]}"
}

start() {
	command -v redis-server >/dev/null || { echo "cluster: redis-server not found (apt-get install redis-server)" >&2; exit 1; }
	command -v redis-cli >/dev/null || { echo "cluster: redis-cli not found (apt-get install redis-tools)" >&2; exit 1; }
	for p in "${ports[@]}"; do start_node "$p"; done
	for p in "${ports[@]}"; do wait_node "$p"; done
	if [[ $(known_nodes "$base") != 3 ]]; then
		local addrs=()
		for p in "${ports[@]}"; do addrs+=("127.0.0.1:$p"); done
		echo "cluster: assigning slots to ${addrs[*]}" >&2
		redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >&2
	fi
	local all
	for _ in $(seq 1 300); do
		all=1
		for p in "${ports[@]}"; do
			if ! cluster_ok "$p" || [[ $(known_nodes "$p") != 3 ]]; then
				all=0
			fi
		done
		if [[ $all == 1 ]]; then
			echo "cluster: 3 masters on 127.0.0.1:${ports[0]}-${ports[2]} ($root)" >&2
			seeds
			return 0
		fi
		sleep 0.1 # poll interval
	done
	echo "cluster: not every node reports cluster_state:ok after 30s" >&2
	for p in "${ports[@]}"; do echo "--- $p" >&2; rcli "$p" cluster info >&2 || true; done
	exit 1
}

stop() { stop_nodes "cluster: stopped node" "${ports[@]}"; }

status() {
	local p pid rc=0
	for p in "${ports[@]}"; do
		if pid=$(running_pid "$p"); then
			if cluster_ok "$p"; then
				echo "node $p: running pid=$pid cluster_state:ok"
			else
				echo "node $p: running pid=$pid cluster not ok"
				rc=1
			fi
		else
			echo "node $p: stopped"
			rc=1
		fi
	done
	return $rc
}

case $cmd in
start) start ;;
stop) stop ;;
status) status ;;
*) usage ;;
esac
