# The README's commands. Everything the scripts start lives under STATE_DIR
# and is stopped by the script that started it.
STATE_DIR ?= $(CURDIR)/.state
export STATE_DIR

.PHONY: demo test build vet fmt clean

demo:
	@bash scripts/demo.sh

test:
	@bash scripts/test.sh

build:
	go build -o bin/relay ./cmd/relay

vet:
	go vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin
