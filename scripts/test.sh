#!/usr/bin/env bash
# make test: installs what is missing, starts containerd (tests start their
# own private redis-servers), then runs vet and the whole suite with the
# race detector. Integration tests fail rather than skip (RELAY_TEST_REQUIRE).
set -euo pipefail
cd "$(dirname "$0")/.."
export STATE_DIR=${STATE_DIR:-$PWD/.state}
bash scripts/setup.sh
source scripts/services.sh
use_go
trap services_stop EXIT
services_start containerd
# --- runtime images: relay.local/python3:bookworm and relay.local/node:bookworm,
# built from Debian packages by scripts/runtime-images.sh (a few minutes the
# first time, cached under $STATE_DIR/images) and imported into containerd.
RELAY_TEST_PYTHON_IMAGE_ARCHIVE=$(scripts/runtime-images.sh "$STATE_DIR" "$CONTAINERD_ADDRESS" python3 | tail -n1) ||
	{ echo "test: building the python3 runtime image failed (see above)" >&2; exit 1; }
RELAY_TEST_NODE_IMAGE_ARCHIVE=$(scripts/runtime-images.sh "$STATE_DIR" "$CONTAINERD_ADDRESS" node | tail -n1) ||
	{ echo "test: building the node runtime image failed (see above)" >&2; exit 1; }
export RELAY_TEST_PYTHON_IMAGE_ARCHIVE RELAY_TEST_NODE_IMAGE_ARCHIVE
# --- end runtime images
export RELAY_TEST_REQUIRE=1
echo "test: go vet ./..."
go vet ./...
# tools/ is a module of its own (the image builder and the tests that need
# Kubernetes, BuildKit or a browser), so that a module requiring Relay does
# not get their dependencies: ./... above does not reach into it.
echo "test: go vet ./... in tools/"
go -C tools vet ./...
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.state/*'))
if [ -n "$unformatted" ]; then
	echo "test: gofmt would change: $unformatted" >&2
	exit 1
fi
# ./... includes the Redis Cluster and Sentinel suites (make test-cluster runs them alone).
echo "test: go test -race ./..."
go test -race -count=1 -timeout 40m ${GOTESTFLAGS:-} ./...
echo "test: go test -race ./... in tools/"
go -C tools test -race -count=1 -timeout 40m ${GOTESTFLAGS:-} ./...
bash scripts/fuzz.sh
