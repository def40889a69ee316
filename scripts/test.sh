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
export RELAY_TEST_REQUIRE=1
echo "test: go vet ./..."
go vet ./...
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.state/*'))
if [ -n "$unformatted" ]; then
	echo "test: gofmt would change: $unformatted" >&2
	exit 1
fi
echo "test: go test -race ./..."
go test -race -count=1 -timeout 40m ${GOTESTFLAGS:-} ./...
bash scripts/fuzz.sh
