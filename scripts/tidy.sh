#!/usr/bin/env bash
# Checks that every Go module of the repository is tidy: that go mod tidy
# would change neither its go.mod nor its go.sum (a requirement missing or
# left over, a go.sum line of a module no longer needed). For each go.mod
# (the library's, contrib/*, bench, tools) it runs go mod tidy -diff, which
# writes nothing, and prints what tidy would change.
#
# It reads the modules from the module cache, and on a fresh machine
# downloads what is missing from the module proxy (GOPROXY), as the build
# does; with a warm cache it needs no network. A module it cannot check (a
# download that failed, say) fails it too, with go's error, not a diff.
#
# Usage: scripts/tidy.sh [module directory ...]   (default: all of them)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if [ $# -gt 0 ]; then
	mods=("$@")
else
	mapfile -t mods < <(find . -name go.mod -not -path '*/testdata/*' -printf '%h\n' | sed 's|^\./||' | sort)
fi

untidy=()
for m in "${mods[@]}"; do
	errs=$(mktemp)
	if diff=$(cd "$root/$m" && go mod tidy -diff 2>"$errs"); then
		rm -f "$errs"
		continue
	fi
	if [ -n "$diff" ]; then
		echo "$m: go.mod or go.sum is not tidy; run (cd $m && go mod tidy) and commit the result. go mod tidy would change:"
		echo "$diff"
	else
		echo "$m: cannot check whether go.mod and go.sum are tidy (go mod tidy -diff failed; a module it needs may be out of reach of GOPROXY=$(go env GOPROXY)):"
		cat "$errs"
	fi
	rm -f "$errs"
	untidy+=("$m")
done

if [ ${#untidy[@]} -gt 0 ]; then
	echo "modules not tidy: ${untidy[*]}"
	exit 1
fi
echo "tidy: ${mods[*]}"
