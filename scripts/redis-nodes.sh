# shellcheck shell=bash
# Sourced by scripts/cluster.sh and scripts/sentinel.sh: the redis-server
# processes of a topology, one per port, each in $root/<port> with its
# redis.pid. The sourcing script sets root before calling these.

# shellcheck disable=SC2154 # root is set by the sourcing script
dir_of() { echo "$root/$1"; }
rcli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

# running_pid PORT prints the PID of the process on PORT when it runs.
running_pid() {
	local pidf pid
	pidf="$(dir_of "$1")/redis.pid"
	[[ -f $pidf ]] || return 1
	pid=$(<"$pidf")
	[[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
	# Guard against PID reuse: the process must be a redis-server on PORT.
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "redis-server.*:$1" || return 1
	echo "$pid"
}

# stop_nodes LABEL PORT... stops the process on each PORT by its PID:
# SIGTERM to all first, then a wait for each (they take a moment to exit),
# SIGKILL after 10s. Each stop is reported as "LABEL PORT (pid PID)".
stop_nodes() {
	local label=$1 p pid entry stopping=()
	shift
	for p in "$@"; do
		if pid=$(running_pid "$p"); then
			kill "$pid"
			stopping+=("$p:$pid")
		fi
		rm -f "$(dir_of "$p")/redis.pid"
	done
	for entry in "${stopping[@]}"; do
		p=${entry%:*} pid=${entry#*:}
		for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null || true
		echo "$label $p (pid $pid)" >&2
	done
}
