#!/usr/bin/env bash
# runtime-images.sh STATE_DIR SOCKET RUNTIME [NAMESPACE]
#
# Builds the offline image of a language runtime from Debian packages and
# imports it into containerd at SOCKET, namespace NAMESPACE (default
# "relay"). No registry is needed, only a Debian mirror (DEBIAN_MIRROR,
# default http://deb.debian.org/debian) and root, for debootstrap.
#
#   RUNTIME   image                        packages
#   python3   relay.local/python3:bookworm python3 python3-pip (interpreter,
#                                          stdlib, and pip for dependency builds)
#   node      relay.local/node:bookworm    nodejs, plus npm $NPM_VERSION from the
#                                          npm registry (for dependency builds)
#
# pip and npm are what Relay runs in a build container to install an app's
# dependencies from its manifest (docs/runtimes.md "Dependencies"). Debian's
# own npm package pulls in some 300 packages that debootstrap fails to
# configure, so npm comes from its registry tarball, checked against its
# pinned sha512 (NPM_REGISTRY, default https://registry.npmjs.org).
#
# Recipe: `debootstrap --variant=minbase --include=PACKAGES bookworm`, minus
# what a handler never needs (apt lists and caches, docs, man pages,
# translations, logs, the build host's hostname and resolver), packed into
# one layer by tools/mkimage -rootfs. mkimage sets every file's
# modification time to one fixed instant, so that a rebuild gives the same
# layer; Python's bytecode caches (.pyc) record their source's time, so the
# python3 image's are compiled again first, as unchecked-hash caches, which
# no time invalidates (PEP 552). Without that, every handler in a fresh
# container found each module it imports stale, compiled it again and wrote
# the cache into its container's layer: several milliseconds per attempt.
#
# The archive is cached at STATE_DIR/images/RUNTIME-bookworm-HASH.tar, HASH
# being a hash of this recipe and of mkimage's source: a rerun with the same
# recipe skips the build (FORCE=1 rebuilds). The import is skipped when this
# archive was already imported into SOCKET/NAMESPACE and the image is there.
# The archive path is printed on stdout last; the runtime tests read it from
# RELAY_TEST_PYTHON_IMAGE_ARCHIVE and RELAY_TEST_NODE_IMAGE_ARCHIVE:
#
#   export RELAY_TEST_PYTHON_IMAGE_ARCHIVE=$(scripts/runtime-images.sh /tmp/relay-dev "$CONTAINERD_ADDRESS" python3 | tail -n1)
set -euo pipefail

[[ $# -ge 3 && $# -le 4 ]] || { echo "usage: $0 STATE_DIR SOCKET python3|node [NAMESPACE]" >&2; exit 2; }
state_dir=$1
sock=$2
runtime=$3
ns=${4:-relay}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
npm_version=
npm_sha512=
pyc=

case $runtime in
python3)
	ref=relay.local/python3:$suite
	packages=python3,python3-pip
	cmd='["python3"]'
	pyc=unchecked-hash
	;;
node)
	ref=relay.local/node:$suite
	packages=nodejs
	npm_version=10.9.2
	npm_sha512=iriPEPIkoMYUy3F6f3wwSZAU93E0Eg6cHwIR6jzzOXWSy+SD/rOODEs74cVONHKSx2obXtuUoyidVEhISrisgQ==
	cmd='["node"]'
	;;
*)
	echo "unknown runtime $runtime (want python3 or node)" >&2
	exit 2
	;;
esac

# Paths under the rootfs removed after debootstrap. Changing this list, the
# packages or anything else above changes the hash and so rebuilds.
prune=(
	var/cache/apt var/lib/apt/lists var/cache/debconf/templates.dat-old
	var/lib/dpkg/status-old var/log
	usr/share/doc usr/share/man usr/share/info usr/share/locale
	usr/share/lintian usr/share/bash-completion
)
recipe="relay runtime image v2
suite=$suite variant=minbase include=$packages ref=$ref cmd=$cmd npm=$npm_version pyc=$pyc
env=LANG=C.UTF-8
prune=${prune[*]}"

repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$state_dir/images"
images=$(cd "$state_dir/images" && pwd)
hash=$({ printf '%s\n' "$recipe"; cat "$repo/tools/mkimage/main.go"; } | sha256sum | cut -c1-12)
archive=$images/$runtime-$suite-$hash.tar
marker=$archive.imported # the SOCKET/NAMESPACE pairs this archive went into

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin

if [[ ${FORCE:-0} == 1 || ! -s $archive ]]; then
	[[ $(id -u) -eq 0 ]] || { echo "building $ref needs root (debootstrap)" >&2; exit 1; }
	command -v debootstrap >/dev/null || { echo "debootstrap not found (apt-get install debootstrap, or run scripts/setup.sh)" >&2; exit 1; }
	rootfs=$images/.rootfs-$runtime-$hash
	log=$images/$runtime-$suite.build.log
	# An if, not &&: a false test as the trap's last command would become the exit status.
	cleanup() { if [[ -n ${rootfs:-} ]]; then rm -rf "$rootfs"; fi; }
	trap cleanup EXIT
	rm -rf "$rootfs"
	start=$SECONDS
	echo "building $ref from Debian $suite ($packages); log: $log" >&2
	if ! debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >"$log" 2>&1; then
		tail -n 20 "$log" >&2
		echo "debootstrap failed (see $log)" >&2
		exit 1
	fi
	if [[ -n $npm_version ]]; then
		tgz=$images/npm-$npm_version.tgz
		curl -fsSL -o "$tgz" "${NPM_REGISTRY:-https://registry.npmjs.org}/npm/-/npm-$npm_version.tgz"
		got=$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)
		[[ $got == "$npm_sha512" ]] || { echo "npm-$npm_version.tgz: sha512 $got, want $npm_sha512" >&2; exit 1; }
		mkdir -p "$rootfs/usr/lib/node_modules/npm"
		tar -xzf "$tgz" -C "$rootfs/usr/lib/node_modules/npm" --strip-components=1 --no-same-owner
		rm -f "$tgz"
		ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$rootfs/usr/bin/npm"
		ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$rootfs/usr/bin/npx"
	fi
	for p in "${prune[@]}"; do
		rm -rf "${rootfs:?}/$p"
	done
	if [[ -n $pyc ]]; then
		# The image's own interpreter, for its own bytecode format.
		# compileall -f rewrites every cache, -q quiet; no -j: its worker
		# processes would need /dev/shm in the chroot.
		if ! chroot "$rootfs" /bin/sh -c "python3 -m compileall -f -q --invalidation-mode $pyc /usr/lib/python3*/" >>"$log" 2>&1; then
			tail -n 20 "$log" >&2
			echo "compiling the bytecode caches failed (see $log)" >&2
			exit 1
		fi
	fi
	mkdir -p "$rootfs/var/log"
	rm -f "$rootfs/etc/hostname"
	: >"$rootfs/etc/resolv.conf"
	mkdir -p "$rootfs/app" # the mount point of the app directory
	go -C "$repo/tools" run ./mkimage -o "$archive" -ref "$ref" -rootfs "$rootfs" \
		-env LANG=C.UTF-8 -cmd "$cmd" -description "relay $runtime runtime: Debian $suite minbase + $packages" >&2
	rm -rf "$rootfs"
	rootfs=
	# Older archives of this runtime were built from another recipe.
	find "$images" -maxdepth 1 -name "$runtime-$suite-*.tar*" ! -name "$(basename "$archive")*" -delete
	rm -f "$marker"
	echo "built $archive in $((SECONDS - start))s: $(du -m "$archive" | cut -f1) MB compressed" >&2
fi

if grep -qxF "$sock $ns" "$marker" 2>/dev/null &&
	ctr --address "$sock" --namespace "$ns" images check "name==$ref" 2>/dev/null | grep -q complete; then
	echo "$ref already present in namespace $ns" >&2
else
	echo "importing $ref into namespace $ns" >&2
	ctr --address "$sock" --namespace "$ns" images import "$archive" >&2
	echo "$sock $ns" >>"$marker"
fi
echo "$archive"
