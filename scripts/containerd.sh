#!/usr/bin/env bash
# containerd.sh start|stop|status STATE_DIR
#
# Runs a private containerd (as root) for Relay development and tests, fully
# contained in STATE_DIR:
#
#   STATE_DIR/containerd/config.toml       generated config
#   STATE_DIR/containerd/root, .../state   containerd root and state dirs
#   STATE_DIR/containerd/containerd.sock   gRPC socket (CONTAINERD_ADDRESS)
#   STATE_DIR/containerd/containerd.log    daemon log
#   STATE_DIR/containerd.pid               daemon PID
#
# start is idempotent (an already running daemon is reused) and prints the
# socket path on stdout; stop kills only the PID in the pid file and waits for
# it to exit. Only the overlayfs snapshotter is enabled; CRI and other plugins
# Relay does not need are disabled so the daemon starts in well under a second.
set -euo pipefail

usage() {
	echo "usage: $0 start|stop|status STATE_DIR" >&2
	exit 2
}

[[ $# -eq 2 ]] || usage
cmd=$1
state_dir=$2
mkdir -p "$state_dir"
state_dir=$(cd "$state_dir" && pwd)

# containerd execs runc and containerd-shim-runc-v2 through PATH.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}

base=$state_dir/containerd
sock=$base/containerd.sock
pidfile=$state_dir/containerd.pid
logfile=$base/containerd.log
config=$base/config.toml
start_timeout=${CONTAINERD_START_TIMEOUT:-30} # seconds

running_pid() {
	local pid
	[[ -f $pidfile ]] || return 1
	pid=$(<"$pidfile")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	# Guard against PID reuse: the process must be a containerd using our config.
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$config" || return 1
	echo "$pid"
}

ready() {
	ctr --address "$sock" version >/dev/null 2>&1
}

write_config() {
	mkdir -p "$base/root" "$base/state"
	cat >"$config" <<TOML
version = 2
root = "$base/root"
state = "$base/state"
oom_score = 0
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.internal.v1.opt",
  "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.native",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "$sock"

[ttrpc]
  address = "$sock.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.runtime.v2.task"]
  platforms = ["linux/amd64"]
TOML
}

start() {
	local pid
	if pid=$(running_pid); then
		if ready; then
			echo "$sock"
			return 0
		fi
	else
		command -v containerd >/dev/null || { echo "containerd not found (apt-get install containerd)" >&2; exit 1; }
		command -v runc >/dev/null || { echo "runc not found in PATH (apt-get install runc)" >&2; exit 1; }
		command -v containerd-shim-runc-v2 >/dev/null || { echo "containerd-shim-runc-v2 not found in PATH" >&2; exit 1; }
		[[ $(id -u) -eq 0 ]] || { echo "containerd must run as root" >&2; exit 1; }
		write_config
		rm -f "$sock" "$sock.ttrpc"
		# setsid: the daemon outlives this script and the caller's process group.
		echo "--- relay containerd.sh start $(date -u +%FT%TZ)" >>"$logfile"
		setsid containerd --config "$config" </dev/null >>"$logfile" 2>&1 &
		pid=$!
		echo "$pid" >"$pidfile"
	fi
	local deadline=$((SECONDS + start_timeout))
	until ready; do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "containerd exited during startup; last log lines:" >&2
			tail -n 20 "$logfile" >&2
			rm -f "$pidfile"
			exit 1
		fi
		if ((SECONDS >= deadline)); then
			echo "containerd not ready after ${start_timeout}s (see $logfile)" >&2
			exit 1
		fi
		sleep 0.05 # poll interval, not a readiness guess
	done
	echo "$sock"
}

stop() {
	local pid
	if ! pid=$(running_pid); then
		rm -f "$pidfile"
		echo "containerd not running" >&2
		return 0
	fi
	kill -TERM "$pid"
	local deadline=$((SECONDS + 15))
	while kill -0 "$pid" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			echo "containerd (pid $pid) ignored SIGTERM; sending SIGKILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
		fi
		sleep 0.05
	done
	rm -f "$pidfile"
	echo "containerd stopped (pid $pid)" >&2
}

status() {
	local pid
	if pid=$(running_pid) && ready; then
		echo "running pid=$pid socket=$sock"
		return 0
	fi
	echo "not running"
	return 1
}

case $cmd in
start) start ;;
stop) stop ;;
status) status ;;
*) usage ;;
esac
