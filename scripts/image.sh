#!/usr/bin/env bash
# image.sh [OUT [REF]]
#
# Builds the relay image of deploy/Containerfile offline (make image): runs
# the Containerfile's `CGO_ENABLED=0 go build` lines with /out in a staging
# directory, copies the host's CA bundle (Debian's ca-certificates, as in the
# golang:bookworm build stage) to the same path there, and has
# tools/mkimage build the final stage from it. OUT (default
# dist/relay-image.tar) is an OCI image layout that is also a docker-archive:
# `ctr images import`, `docker load`, `skopeo copy oci-archive:OUT ...` and
# `crane push OUT ...` take it. REF (default $IMAGE_REF, else
# relay.local/relay:dev) is the name stored in it.
#
# Reproducible: file and image times are SOURCE_DATE_EPOCH, by default the
# time of the checked-out commit, and the label org.opencontainers.image.revision
# its hash, so one commit gives one digest with the same Go toolchain,
# wherever it is checked out (go -C tools test ./deploy/ builds twice and
# compares).
# Prints "OUT REF DIGEST" on stdout last.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$repo/dist/relay-image.tar}
ref=${2:-${IMAGE_REF:-relay.local/relay:dev}}
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
containerfile=$repo/deploy/Containerfile

[[ -s $ca ]] || { echo "image: no CA bundle at $ca (apt-get install ca-certificates)" >&2; exit 1; }
if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
	SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct 2>/dev/null) ||
		{ echo "image: not a git checkout: set SOURCE_DATE_EPOCH" >&2; exit 1; }
fi
export SOURCE_DATE_EPOCH

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$(dirname "$out")" "$stage/out"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
builds=$(sed -n 's/^RUN \(CGO_ENABLED=0 go build .* -o \/out\/.*\)$/\1/p' "$containerfile")
[[ $(wc -l <<<"$builds") == 2 ]] || { echo "image: want two 'RUN CGO_ENABLED=0 go build ... -o /out/...' lines in $containerfile" >&2; exit 1; }
cd "$repo"
while IFS= read -r build; do
	echo "image: ${build}" >&2
	bash -c "${build// \/out\// $stage/out/}"
done <<<"$builds"
install -D -m 0644 "$ca" "$stage/etc/ssl/certs/ca-certificates.crt"

# The commit, as a label (IMAGE_REVISION outside a git checkout).
labels=()
rev=${IMAGE_REVISION:-$(git -C "$repo" rev-parse HEAD 2>/dev/null || true)}
if [[ -n $rev ]]; then
	labels+=(-label "org.opencontainers.image.revision=$rev")
fi
go -C tools run ./mkimage -o "$out" -ref "$ref" -containerfile "$containerfile" -stage "build=$stage" "${labels[@]}"
