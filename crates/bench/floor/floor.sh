#!/usr/bin/env bash
# The floor of PostgreSQL's CPU per job: what the server spends on the bare
# statements one job needs (cycle.sql, attempt.sql), with none of pgfifo's
# features, to compare with `pgfifo-bench latency`'s pg_cpu_ms_per_job in the
# same sitting (see crates/bench/NOTEBOOK.md, "Issue 19 part 2: the floor").
#
# Usage: crates/bench/floor/floor.sh [seconds]  (needs pgbench, psql, the
# pgfifo CLI built: cargo build --release -p pgfifo-cli; and, to read the
# backends' CPU from /proc, the same machine as the server)
#
# Prints the CPU (user + system) of the pgbench backend per job for each
# script, sampled from /proc over the middle of the run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
secs=${1:-5}
host=${PGHOST:-127.0.0.1}
user=${PGUSER:-postgres}
db=pgfifo_floor
psql -h "$host" -U "$user" -qAt -d postgres -c "SET client_min_messages = warning" \
    -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
"$root/target/release/pgfifo" --database-url "postgres://$user@$host/$db" migrate up >/dev/null
psql -h "$host" -U "$user" -qAt -d "$db" -c "
    INSERT INTO pgfifo.queue_group (queue, group_id, slot)
    SELECT 'floor', 'g' || i, pgfifo.group_hash('floor', 'g' || i) FROM generate_series(0, 199) AS i"

# CPU ticks (user + system) of the pgbench backends of $db.
ticks() {
    local total=0 t
    for pid in $(psql -h "$host" -U "$user" -qAt -d postgres -c \
        "SELECT pid FROM pg_stat_activity WHERE datname = '$db' AND application_name = 'pgbench'"); do
        t=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
        total=$((total + t))
    done
    echo "$total"
}

# Runs a script for secs + 2 seconds; samples the middle secs seconds.
measure() {
    local out
    out=$(mktemp)
    pgbench -h "$host" -U "$user" -n -M prepared -f "$1" -T $((secs + 2)) -P 1 "$db" >"$out" 2>&1 &
    local bench=$!
    sleep 1.5
    local before after
    before=$(ticks)
    sleep "$secs"
    after=$(ticks)
    wait "$bench"
    local tps
    tps=$(awk -v s="$secs" '/^progress: /{n++; if (n >= 2 && n <= s + 1) {t += $4; c++}} END {print t / c}' "$out")
    rm -f "$out"
    awk -v a="$before" -v b="$after" -v s="$secs" -v tps="$tps" -v hz="$(getconf CLK_TCK)" -v name="$2" \
        'BEGIN {printf "%s: %.0f jobs/s, %.3f ms of backend CPU per job\n", name, tps, (b - a) * 1000 / hz / s / tps}'
}

measure "$here/cycle.sql" "cycle (enqueue, pick, outcome)"
measure "$here/attempt.sql" "attempt record"
psql -h "$host" -U "$user" -qAt -d postgres -c "DROP DATABASE $db"
