#!/usr/bin/env bash
# The project's test command: brings up the local Redis, PostgreSQL and
# Redis Cluster (installing them where missing), then runs every test with
# the race detector. Extra arguments go to go test (e.g. -run, -count).
# A package's tests may take up to 30 minutes (go test's default is 10):
# the PostgreSQL store's take 4 to 5 on a quiet machine, and more than 10
# were seen on a shared one beside other runs against the same server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
exec go test -race -timeout 30m "$@" ./...
