#!/usr/bin/env bash
# Runs every fuzz target of the matcher for a bounded time each, on top of
# the seed corpora in matcher/testdata/fuzz (which plain go test replays).
# FUZZTIME overrides the time per target (default 20s). A finding leaves its
# crasher in matcher/testdata/fuzz/<target>/: commit it with the fix.
#
# A failure that wrote no crasher is the fuzzing engine's own trouble, not a
# finding: on a loaded 2-core machine its coordinator sometimes reports
# "context deadline exceeded" when -fuzztime ends mid-input. That target then
# runs again, up to three tries; a real finding fails at once.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-20s}
crashers() { find "matcher/testdata/fuzz/$1" -type f 2>/dev/null | sort; }
for target in FuzzParse FuzzMatch FuzzExplain; do
	for try in 1 2 3; do
		before=$(crashers "$target")
		echo "fuzz: $target for $fuzztime"
		if go test -run='^$' -fuzz="^${target}\$" -fuzztime="$fuzztime" ./matcher/; then
			break
		fi
		new=$(comm -13 <(echo "$before") <(crashers "$target"))
		if [ -n "$new" ]; then
			echo "fuzz: $target found a failing input: $new" >&2
			exit 1
		fi
		if [ "$try" = 3 ]; then
			echo "fuzz: $target failed three times without a failing input" >&2
			exit 1
		fi
		echo "fuzz: $target failed without a failing input; running it once more" >&2
	done
done
