#!/usr/bin/env bash
# make bench: runs the benchmarks under bench/ and prints one table each:
# pipeline throughput with Redis reads, Redis CPU, worker CPU, allocations
# and Redis bytes per event, with the invocation retention 48h and 0 at 1
# worker and 48h at 3, against the raw XREADGROUP+XACK loop of the same run,
# then publish → ack latency at a trickle (1 event/s) of both (bench/pipeline),
# the server time of a claim and a settlement (invocation BenchmarkScriptCost),
# end-to-end latency per runner with `ctr run --rm` as the anchor of one-shot
# containerd, bursts against parallel `ctr run --rm` loops and the runtime
# targets table (bench/runners), and the memory of a worker with 10,000
# pending messages (bench/memory), and last the retention-0 check: the key
# count of Redis under 2 dead letters/s must not grow (bench/retention,
# 65 s; it fails make bench when it does), and the memory projection of
# relay stats against the peak used_memory of a worker trimming a stream of
# 100 events/s kept 30 s every minute (bench/projection, 4.5 minutes; it
# fails make bench when the two differ by over 25 %). Each program starts its own private
# redis-server. containerd is started under STATE_DIR as make test does,
# and stopped on exit only if this script started it. The busybox test
# image and the python3 and node runtime images (built from Debian packages
# the first time, a few minutes, then cached) are imported into the namespace the
# runners benchmark uses.
#
# Extra flags per program: BENCH_PIPELINE_FLAGS, BENCH_RUNNERS_FLAGS,
# BENCH_MEMORY_FLAGS, BENCH_RETENTION_FLAGS, BENCH_PROJECTION_FLAGS, e.g.
# BENCH_PIPELINE_FLAGS="-events 50000 -runs 5 -trickle 60".
# The machine's load is printed first: the figures depend on it.
set -euo pipefail
cd "$(dirname "$0")/.."
export STATE_DIR=${STATE_DIR:-$PWD/.state}
bash scripts/setup.sh
source scripts/services.sh
use_go
trap services_stop EXIT
services_start containerd
namespace=relay-bench
scripts/images.sh "$STATE_DIR" "$CONTAINERD_ADDRESS" "$namespace" >/dev/null
scripts/runtime-images.sh "$STATE_DIR" "$CONTAINERD_ADDRESS" python3 "$namespace" >/dev/null
scripts/runtime-images.sh "$STATE_DIR" "$CONTAINERD_ADDRESS" node "$namespace" >/dev/null

mkdir -p "$STATE_DIR/bin"
for b in pipeline runners memory retention projection; do
	go build -o "$STATE_DIR/bin/bench-$b" "./bench/$b"
done
# bench-runners uses the exec helper next to it, as relay start does.
CGO_ENABLED=0 go build -o "$STATE_DIR/bin/relay-exec" ./cmd/relay-exec
echo "bench: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')"
"$STATE_DIR/bin/bench-pipeline" ${BENCH_PIPELINE_FLAGS:-}
# The Redis server time of the scripts of one invocation, apart from the
# worker and the network (bench/RESULTS.md section 4.7).
go test -run '^$' -bench ScriptCost -benchtime 500x ./invocation/redisstate | grep -E '^Benchmark'
"$STATE_DIR/bin/bench-runners" -containerd "$CONTAINERD_ADDRESS" -namespace "$namespace" ${BENCH_RUNNERS_FLAGS:-}
"$STATE_DIR/bin/bench-memory" ${BENCH_MEMORY_FLAGS:-}
echo "bench: load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$STATE_DIR/bin/bench-retention" ${BENCH_RETENTION_FLAGS:-}
"$STATE_DIR/bin/bench-projection" ${BENCH_PROJECTION_FLAGS:-}
echo "bench: load average after $(cut -d' ' -f1-3 /proc/loadavg)"
