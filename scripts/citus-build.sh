#!/usr/bin/env bash
# Builds Citus from ../shared/vendor/citus (the tests' distributed PostgreSQL)
# when it is missing, and installs it into the server that `pg_config` names.
#
# The build is cached outside the clone, under
# ${PGFIFO_CACHE:-~/.cache/pgfifo}/citus-<sha256 of the tarball>, so a second
# run only copies the built files (`make install`) or does nothing at all when
# the installed citus.so already matches the cache. The system server on 5432
# is never reconfigured: the Citus tests start private servers that preload it.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
vendor="${PGFIFO_CITUS_VENDOR:-$here/../shared/vendor/citus}"
tarballs=("$vendor"/citus-*.tar.gz)
tarball="${tarballs[0]}"
patch_file="$vendor/pg15.20-have_createdb_privilege.patch"
[ -f "$tarball" ] || { echo "citus-build: no citus-*.tar.gz in $vendor" >&2; exit 1; }

# The build's dependencies first: pg_config itself comes with them, and
# installing the server headers can upgrade (and restart) the server package,
# so this runs before any test starts. dpkg -s keeps it cheap when present.
need=()
for p in gcc make patch postgresql-server-dev-15 liblz4-dev libzstd-dev libkrb5-dev libssl-dev \
    libselinux1-dev libxslt1-dev libpam0g-dev libreadline-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "citus-build: installing ${need[*]}"
    apt-get install -y "${need[@]}" >/dev/null \
        || { apt-get update >/dev/null && apt-get install -y "${need[@]}" >/dev/null; }
fi
pg_config="${PG_CONFIG:-pg_config}"
libdir="$("$pg_config" --pkglibdir)"
sum="$(sha256sum "$tarball" | cut -c1-16)"
cache="${PGFIFO_CACHE:-${HOME:-/tmp}/.cache/pgfifo}/citus-$sum-pg$("$pg_config" --version | awk '{print $2}')"
src="$cache/src"

if [ -f "$cache/built" ] && [ -f "$libdir/citus.so" ] \
    && cmp -s "$src/src/backend/distributed/citus.so" "$libdir/citus.so"; then
    echo "citus-build: installed and up to date ($cache)"
    exit 0
fi

if [ ! -f "$cache/built" ]; then
    echo "citus-build: building $(basename "$tarball") into $cache"
    rm -rf "$cache"
    mkdir -p "$src"
    tar xzf "$tarball" -C "$src" --strip-components=1
    (
        cd "$src"
        # The patch is only needed with headers that declare have_createdb_privilege().
        if grep -q 'have_createdb_privilege' "$("$pg_config" --includedir-server)/commands/dbcommands.h"; then
            patch -p1 -s < "$patch_file"
        fi
        ./configure --without-libcurl PG_CONFIG="$pg_config" >"$cache/configure.log" 2>&1 \
            || { tail -30 "$cache/configure.log" >&2; exit 1; }
        make with_llvm=no -j"$(nproc)" >"$cache/make.log" 2>&1 \
            || { tail -30 "$cache/make.log" >&2; exit 1; }
    )
    touch "$cache/built"
fi

echo "citus-build: installing into $libdir"
make -C "$src" with_llvm=no install >"$cache/install.log" 2>&1 \
    || { tail -30 "$cache/install.log" >&2; exit 1; }
echo "citus-build: done ($("$pg_config" --sharedir)/extension/citus.control)"
