#!/usr/bin/env bash
# The project's test command: brings up the local Redis, PostgreSQL and
# Redis Cluster (installing them where missing), then runs every test with
# the race detector. Extra arguments go to go test (e.g. -run, -count).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
exec go test -race "$@" ./...
