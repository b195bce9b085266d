#!/usr/bin/env bash
# Vets and tests the nested Go modules of the repository, which the root's
# ./... does not reach: every directory with a go.mod under contrib/ (one
# integration each: OpenTelemetry, Prometheus, gRPC, the web frameworks),
# and bench/. For each, in its own directory: go vet ./..., staticcheck (the
# version pinned in tools/go.mod) and go test -race -count=1 ./...
#
# The modules build against this checkout (a replace of the library's
# module path), so a change of the library that breaks one fails here. The
# bench module's tests talk to the local Redis and PostgreSQL:
# scripts/services.sh brings them up first.
#
# Usage: scripts/modules.sh [module directory ...]   (default: all of them)
# Extra go test flags go in GOTESTFLAGS (default: -race -count=1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if [ $# -gt 0 ]; then
	mods=("$@")
else
	mapfile -t mods < <(find contrib bench -name go.mod -not -path '*/testdata/*' -printf '%h\n' | sort)
fi
read -r -a testflags <<<"${GOTESTFLAGS:--race -count=1}"

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
(cd tools && go build -o "$bin/staticcheck" honnef.co/go/tools/cmd/staticcheck)

for m in "${mods[@]}"; do
	case "$m" in
	bench | bench/*) scripts/services.sh redis postgres ;;
	esac
done

failed=()
for m in "${mods[@]}"; do
	echo "== $m"
	start=$SECONDS
	if (cd "$root/$m" && go vet ./... && "$bin/staticcheck" ./... && go test "${testflags[@]}" ./...); then
		echo "-- $m: ok in $((SECONDS - start)) s"
	else
		echo "-- $m: FAILED"
		failed+=("$m")
	fi
done

if [ ${#failed[@]} -gt 0 ]; then
	echo "modules failed: ${failed[*]}"
	exit 1
fi
