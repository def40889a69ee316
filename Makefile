# The README's commands. Everything the scripts start lives under STATE_DIR
# and is stopped by the script that started it.
STATE_DIR ?= $(CURDIR)/.state
export STATE_DIR

.PHONY: demo test soak build vet fmt clean

demo:
	@bash scripts/demo.sh

test:
	@bash scripts/test.sh

# A longer fault soak: 100,000 events through three worker processes that
# are killed and restarted at random (make test runs 10,000).
soak:
	RELAY_SOAK_EVENTS=$${RELAY_SOAK_EVENTS:-100000} go test -count=1 -v -timeout 60m -run TestSoakWithRandomKills ./faults/

build:
	go build -o bin/relay ./cmd/relay

vet:
	go vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin
