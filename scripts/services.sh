#!/usr/bin/env bash
# Brings up the local servers the store tests talk to, on loopback only:
#   Redis       127.0.0.1:6379
#   PostgreSQL  127.0.0.1:5432 (trust auth, database "test")
#   a three-node Redis Cluster on 127.0.0.1:7101-7103
#   for the failure tests, which stop and restart them: a second Redis on
#   127.0.0.1:6390 and a second PostgreSQL cluster "ratelimit_failover" on
#   127.0.0.1:5490 (database "test")
# Installs redis-server or postgresql with apt-get where missing, starts what
# is down, and waits until each answers. Safe to run again: what is up is
# left alone. Usage: scripts/services.sh [redis|postgres|cluster ...]
set -euo pipefail

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(redis postgres cluster failover)

log() { echo "services: $*" >&2; }

apt_install() {
	if [ -z "${APT_UPDATED:-}" ]; then
		apt-get update -qq >&2
		APT_UPDATED=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

wait_for() { # description, command...
	local what=$1
	shift
	for _ in $(seq 1 100); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.1
	done
	log "$what did not come up"
	return 1
}

redis() {
	command -v redis-server >/dev/null || apt_install redis-server
	if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
		log "starting redis on 127.0.0.1:6379"
		redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no >&2
	fi
	wait_for "redis" redis-cli -h 127.0.0.1 -p 6379 ping
}

postgres() {
	command -v pg_ctlcluster >/dev/null || apt_install postgresql
	if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
		log "starting postgresql on 127.0.0.1:5432"
		local v
		v=$(ls /etc/postgresql | sort -V | tail -n 1)
		pg_ctlcluster --skip-systemctl-redirect "$v" main start >&2
	fi
	wait_for "postgresql" pg_isready -h 127.0.0.1 -p 5432
	# A fresh install has no trust auth on loopback nor a database "test".
	if ! psql -h 127.0.0.1 -U postgres -d postgres -Atc 'select 1' >/dev/null 2>&1; then
		local v hba
		v=$(ls /etc/postgresql | sort -V | tail -n 1)
		hba=/etc/postgresql/$v/main/pg_hba.conf
		log "enabling trust auth on loopback in $hba"
		sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
		pg_ctlcluster --skip-systemctl-redirect "$v" main reload >&2
		wait_for "postgresql trust auth" psql -h 127.0.0.1 -U postgres -d postgres -Atc 'select 1'
	fi
	if [ "$(psql -h 127.0.0.1 -U postgres -d postgres -Atc "select 1 from pg_database where datname='test'")" != 1 ]; then
		psql -h 127.0.0.1 -U postgres -d postgres -qc 'create database test' >&2
	fi
}

CLUSTER_PORTS=(7101 7102 7103)
CLUSTER_DIR=${RATELIMIT_CLUSTER_DIR:-/tmp/ratelimit-redis-cluster}

cluster() {
	command -v redis-server >/dev/null || apt_install redis-server
	if redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[0]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then
		return 0
	fi
	log "starting a three-node redis cluster on 127.0.0.1:${CLUSTER_PORTS[*]}"
	local nodes=()
	for p in "${CLUSTER_PORTS[@]}"; do
		redis-cli -h 127.0.0.1 -p "$p" shutdown nosave >/dev/null 2>&1 || true
		rm -rf "${CLUSTER_DIR:?}/$p"
		mkdir -p "$CLUSTER_DIR/$p"
		redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --dir "$CLUSTER_DIR/$p" \
			--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
			--save "" --appendonly no --logfile "$CLUSTER_DIR/$p/redis.log" >&2
		wait_for "redis node $p" redis-cli -h 127.0.0.1 -p "$p" ping
		nodes+=("127.0.0.1:$p")
	done
	redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >&2
	wait_for "redis cluster" sh -c "redis-cli -h 127.0.0.1 -p ${CLUSTER_PORTS[0]} cluster info | grep -q cluster_state:ok"
}

FAILOVER_REDIS_PORT=6390
FAILOVER_PG_PORT=5490
FAILOVER_PG_NAME=ratelimit_failover

failover() {
	command -v redis-server >/dev/null || apt_install redis-server
	command -v pg_ctlcluster >/dev/null || apt_install postgresql
	if ! redis-cli -h 127.0.0.1 -p "$FAILOVER_REDIS_PORT" ping >/dev/null 2>&1; then
		log "starting the failover redis on 127.0.0.1:$FAILOVER_REDIS_PORT"
		redis-server --daemonize yes --bind 127.0.0.1 --port "$FAILOVER_REDIS_PORT" --save "" --appendonly no \
			--dir /tmp --logfile /tmp/ratelimit-failover-redis.log >&2
	fi
	wait_for "failover redis" redis-cli -h 127.0.0.1 -p "$FAILOVER_REDIS_PORT" ping
	local v
	v=$(ls /etc/postgresql | sort -V | tail -n 1)
	if [ ! -d "/etc/postgresql/$v/$FAILOVER_PG_NAME" ]; then
		log "creating the failover postgresql cluster $FAILOVER_PG_NAME on port $FAILOVER_PG_PORT"
		pg_createcluster "$v" "$FAILOVER_PG_NAME" -p "$FAILOVER_PG_PORT" -- --auth=trust >&2
		echo "listen_addresses = '127.0.0.1'" >>"/etc/postgresql/$v/$FAILOVER_PG_NAME/postgresql.conf"
	fi
	if ! pg_isready -h 127.0.0.1 -p "$FAILOVER_PG_PORT" >/dev/null 2>&1; then
		pg_ctlcluster --skip-systemctl-redirect "$v" "$FAILOVER_PG_NAME" start >&2 || true
	fi
	wait_for "failover postgresql" pg_isready -h 127.0.0.1 -p "$FAILOVER_PG_PORT"
	if [ "$(psql -h 127.0.0.1 -p "$FAILOVER_PG_PORT" -U postgres -d postgres -Atc "select 1 from pg_database where datname='test'")" != 1 ]; then
		psql -h 127.0.0.1 -p "$FAILOVER_PG_PORT" -U postgres -d postgres -qc 'create database test' >&2
	fi
}

for w in "${want[@]}"; do
	case "$w" in
	redis) redis ;;
	postgres) postgres ;;
	cluster) cluster ;;
	failover) failover ;;
	*)
		log "unknown service $w: use redis, postgres, cluster or failover"
		exit 2
		;;
	esac
done
log "up: ${want[*]}"
