# The README's commands. Everything the scripts start lives under STATE_DIR
# and is stopped by the script that started it.
STATE_DIR ?= $(CURDIR)/.state
export STATE_DIR

.PHONY: demo console test soak build vet fmt clean

demo:
	@bash scripts/demo.sh

# relay console on the newest demo run (docs/console.md): starts Redis and
# containerd under STATE_DIR if they are not running, serves
# http://127.0.0.1:8089 until Ctrl-C, then stops what it started.
console:
	@bash scripts/console.sh

test:
	@bash scripts/test.sh

# Longer fault soaks (tests/faults/): 100,000 events through in-process handlers
# while workers are killed (a third of that under Redis restarts), 3,000
# through containerd while workers are killed and containerd restarts, and
# the retention soak ("a month in an hour": retentions of seconds, workers
# killed and apps edited, invocation state kept 10 s and deleted at the ack)
# for 10 minutes each; make test runs 10,000, 300 and 1 minute each;
# containerd is stalled (SIGSTOP) for 60 seconds under workers, 5 in make
# test; network faults between workers and Redis (black holes of 5-90 s)
# run for 10 minutes, 40 seconds in make test. Like make test it starts
# containerd under STATE_DIR and stops only what it started. Each soak logs its ledger table; the retention soak
# also its curve (bench/RESULTS.md).
soak:
	@bash -c 'set -euo pipefail; source scripts/services.sh; use_go; trap services_stop EXIT; \
		services_start containerd; export RELAY_TEST_REQUIRE=1; \
		export RELAY_SOAK_EVENTS=$${RELAY_SOAK_EVENTS:-100000} RELAY_SOAK_CONTAINERD_EVENTS=$${RELAY_SOAK_CONTAINERD_EVENTS:-3000} \
		RELAY_SOAK_RETENTION_DURATION=$${RELAY_SOAK_RETENTION_DURATION:-10m} \
		RELAY_SOAK_CONTAINERD_STALL=$${RELAY_SOAK_CONTAINERD_STALL:-60s} \
		RELAY_SOAK_NETWORK_DURATION=$${RELAY_SOAK_NETWORK_DURATION:-10m}; \
		go test -race -count=1 -v -timeout 90m -run "Soak" ./tests/faults/'

# The Redis Cluster and Sentinel suites alone: topologies started by
# scripts/cluster.sh and scripts/sentinel.sh, the cluster end-to-end run,
# the failover ledger, connection modes and the deployment files (in the
# tools module). make test runs them too, as part of go test ./...
.PHONY: test-cluster
test-cluster:
	@bash scripts/setup.sh
	@bash -c 'source scripts/services.sh && use_go && export RELAY_TEST_REQUIRE=1 && \
		go test -race -count=1 -timeout 20m ./tests/cluster/ ./internal/topology/ && \
		go -C tools test -race -count=1 -timeout 20m ./deploy/ && \
		go test -race -count=1 -timeout 20m -run "Redis|Cluster|Sentinel|ACL|TLS" ./cmd/relay/'

# Benchmarks (bench/): pipeline throughput against a raw XREADGROUP+XACK
# loop (with Redis reads, Redis and worker CPU and allocations per event,
# and publish → ack latency at 1 event/s), end-to-end latency per runner
# against `ctr run --rm` (one at a time and in bursts) with the runtime
# targets, worker memory with 10,000 pending messages, a table each, and
# the retention-0 key count under dead letters (fails when it grows), and
# relay stats' memory projection against the peak Redis reaches (fails
# when over 25 % off). Starts containerd
# under STATE_DIR like make test; results of this machine: bench/RESULTS.md.
.PHONY: bench
bench:
	@bash scripts/bench.sh

# relay-exec, next to relay, lets one-shot containers get their task ahead
# of demand (docs/runtimes.md "One-shot containers"); it must be static.
build:
	go build -o bin/relay ./cmd/relay
	CGO_ENABLED=0 go build -o bin/relay-exec ./cmd/relay-exec

# The relay image of deploy/Containerfile, built offline by
# tools/mkimage (docs/deployment.md "Container image"):
# dist/relay-image.tar, an OCI layout that is also a docker-archive, for
# ctr images import, docker load, skopeo or crane. IMAGE_REF names it
# (default relay.local/relay:dev); one commit gives one digest.
.PHONY: image
image:
	@bash -c 'source scripts/services.sh && use_go && scripts/image.sh dist/relay-image.tar'

vet:
	go vet ./...
	go -C tools vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin dist
