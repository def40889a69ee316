#!/usr/bin/env bash
# images.sh STATE_DIR SOCKET [NAMESPACE]
#
# Builds Relay's offline test image relay.local/busybox:latest from Debian's
# busybox-static (no registry needed) and imports it into containerd at
# SOCKET, namespace NAMESPACE (default "relay").
#
# The archive is cached at STATE_DIR/images/busybox.tar and rebuilt only when
# /bin/busybox or the builder (tools/mkimage) is newer, or with
# FORCE=1. The import is skipped when the image already exists. The archive
# path is printed on stdout last; tests read it from RELAY_TEST_IMAGE_ARCHIVE:
#
#   export RELAY_TEST_IMAGE_ARCHIVE=$(scripts/images.sh /tmp/relay-dev "$CONTAINERD_ADDRESS" | tail -n1)
set -euo pipefail

[[ $# -ge 2 && $# -le 3 ]] || { echo "usage: $0 STATE_DIR SOCKET [NAMESPACE]" >&2; exit 2; }
state_dir=$1
sock=$2
ns=${3:-relay}
ref=relay.local/busybox:latest
busybox=${BUSYBOX:-/bin/busybox}
[[ $busybox == /* ]] || busybox=$PWD/$busybox # mkimage runs in tools/

repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$state_dir/images"
archive=$(cd "$state_dir/images" && pwd)/busybox.tar

[[ -x $busybox ]] || { echo "$busybox not found (apt-get install busybox-static)" >&2; exit 1; }
if ldd "$busybox" >/dev/null 2>&1; then
	echo "$busybox is dynamically linked; install busybox-static" >&2
	exit 1
fi

stale=${FORCE:-0}
if [[ ! -s $archive || $busybox -nt $archive || $repo/tools/mkimage/main.go -nt $archive ]]; then
	stale=1
fi
if [[ $stale == 1 ]]; then
	echo "building $archive" >&2
	go -C "$repo/tools" run ./mkimage -o "$archive" -ref "$ref" -busybox "$busybox" >&2
fi

if [[ $stale == 0 ]] && ctr --address "$sock" --namespace "$ns" images check "name==$ref" 2>/dev/null | grep -q complete; then
	echo "$ref already present in namespace $ns" >&2
else
	echo "importing $ref into namespace $ns" >&2
	ctr --address "$sock" --namespace "$ns" images import "$archive" >&2
	# ctr unpacks into the default snapshotter (overlayfs) as part of import
fi
echo "$archive"
