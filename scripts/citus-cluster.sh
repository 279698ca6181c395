#!/usr/bin/env bash
# A private Citus cluster for benchmarks and trials by hand: a coordinator and
# two workers on 127.0.0.1, each its own server under one directory, with
# the settings of the Citus suite (tests/src/citus.rs). The system server on
# 5432 is never touched.
#
#   scripts/citus-cluster.sh start [DIR] [PORT]   # ports PORT, PORT+1, PORT+2 (default 5701)
#   scripts/citus-cluster.sh stop  [DIR]          # stops the servers and deletes DIR
#
# DIR defaults to /tmp/pgfifo-citus. `start` prints the coordinator's URL,
# for `DATABASE_URL`:
#
#   CITUS=1 DATABASE_URL=postgres://postgres@127.0.0.1:5701/postgres \
#     cargo run --release -p pgfifo-bench -- fifo-groups
#
# Citus must be installed for the server first (scripts/citus-build.sh).
set -euo pipefail
cmd="${1:-}"
dir="${2:-/tmp/pgfifo-citus}"
port="${3:-5701}"
bin="${PG_BIN:-/usr/lib/postgresql/15/bin}"
names=(coordinator worker1 worker2)

# As root, the servers run as postgres (initdb refuses root).
as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$cmd" in
start)
    [ -f "$bin/../lib/citus.so" ] || [ -f "$(dirname "$bin")/lib/citus.so" ] \
        || { echo "citus-cluster: citus.so is missing; run scripts/citus-build.sh" >&2; exit 1; }
    [ -e "$dir" ] && { echo "citus-cluster: $dir exists; stop that cluster first" >&2; exit 1; }
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    for i in 0 1 2; do
        node="$dir/${names[$i]}"
        p=$((port + i))
        as_pg "$bin/initdb" -D "$node" -U postgres --auth=trust -E UTF8 --no-instructions >/dev/null
        cat >>"$node/postgresql.conf" <<EOF
port = $p
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
shared_preload_libraries = 'citus'
max_connections = 200
max_prepared_transactions = 200
shared_buffers = 128MB
citus.node_conninfo = 'sslmode=prefer'
citus.max_cached_conns_per_worker = 4
EOF
        as_pg "$bin/pg_ctl" -D "$node" -l "$node.log" -w -t 60 start >/dev/null
        psql -X -q -h 127.0.0.1 -p "$p" -U postgres -d postgres -c "CREATE EXTENSION citus" >/dev/null
    done
    psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres \
        -c "SELECT citus_set_coordinator_host('127.0.0.1', $port)" \
        -c "SELECT citus_add_node('127.0.0.1', $((port + 1)))" \
        -c "SELECT citus_add_node('127.0.0.1', $((port + 2)))" >/dev/null
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
stop)
    for name in "${names[@]}"; do
        [ -d "$dir/$name" ] && as_pg "$bin/pg_ctl" -D "$dir/$name" -m immediate stop >/dev/null 2>&1 || true
    done
    rm -rf "$dir"
    ;;
*)
    echo "usage: $0 start|stop [DIR] [PORT]" >&2
    exit 2
    ;;
esac
