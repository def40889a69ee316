#!/usr/bin/env bash
# Installs what Relay's demo and tests need and is missing: redis-server,
# containerd (with ctr), runc, busybox-static (the example image's rootfs),
# debootstrap (the python3/node runtime images), ca-certificates (the relay
# image's CA bundle), chromium (the console's browser test) and a Go
# toolchain new enough for go.mod. Idempotent; needs root for apt.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v containerd >/dev/null || need+=(containerd)
command -v ctr >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v curl >/dev/null || need+=(curl)
command -v unzip >/dev/null || need+=(unzip)
command -v git >/dev/null || need+=(git)
command -v gcc >/dev/null || need+=(gcc)   # go test -race needs cgo
# --- runtime images (scripts/runtime-images.sh): python3/node images are
# built from Debian packages with debootstrap.
[ -x /usr/sbin/debootstrap ] || command -v debootstrap >/dev/null || need+=(debootstrap)
# --- end runtime images
# --- producers: docs/producing.md's Python and Node.js examples run in
# make test (producer/docs_test.go) with Debian's Redis clients.
dpkg -s python3-redis >/dev/null 2>&1 || need+=(python3-redis)
dpkg -s node-redis >/dev/null 2>&1 || need+=(node-redis)
# --- end producers
# --- relay image (scripts/image.sh, make image): Debian's CA bundle goes into it.
[ -s /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
# --- end relay image
# --- console: the browser tests (tools/console/) drive Debian's
# headless chromium; fonts-dejavu-core gives their screenshots legible text.
command -v chromium >/dev/null || need+=(chromium)
dpkg -s fonts-dejavu-core >/dev/null 2>&1 || need+=(fonts-dejavu-core)
# --- end console

if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "setup: missing ${need[*]}; run as root (or apt-get install them)" >&2
		exit 1
	fi
	echo "setup: installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Go: use the one on PATH (or /usr/local/go) when it satisfies go.mod;
# otherwise fetch the official toolchain module through the Go module proxy.
want=$(awk '/^go /{print $2; exit}' go.mod)
have_go() {
	local g=$1
	[ -x "$g" ] || return 1
	local v; v=$("$g" env GOVERSION 2>/dev/null | sed 's/^go//') || return 1
	[ "$(printf '%s\n%s\n' "$want" "$v" | sort -V | head -1)" = "$want" ]
}
state=${STATE_DIR:-$PWD/.state}
for g in "$(command -v go || true)" /usr/local/go/bin/go "$state/go/bin/go"; do
	if [ -n "$g" ] && have_go "$g"; then
		echo "setup: using $("$g" version) at $g"
		exit 0
	fi
done
proxy=${GOPROXY:-https://proxy.golang.org}
proxy=${proxy%%,*}
[ "$proxy" = direct ] && proxy=https://proxy.golang.org
arch=$(dpkg --print-architecture)
mod="golang.org/toolchain/@v/v0.0.1-go${want}.linux-${arch}.zip"
echo "setup: fetching Go ${want} from the module proxy"
mkdir -p "$state"
tmp=$(mktemp -d)
curl -fsSL "$proxy/$mod" -o "$tmp/go.zip"
unzip -q "$tmp/go.zip" -d "$tmp"
rm -rf "$state/go"
mv "$tmp/golang.org/toolchain@v0.0.1-go${want}.linux-${arch}" "$state/go"
chmod +x "$state"/go/bin/* "$state"/go/pkg/tool/*/* 2>/dev/null || true
rm -rf "$tmp"
echo "setup: using $("$state/go/bin/go" version) at $state/go/bin/go"
