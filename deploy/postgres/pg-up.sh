#!/usr/bin/env bash
# Start a throw-away PostgreSQL cluster for tests and local use (see deploy/postgres/README.md).
# Last line of stdout: the connection URL postgresql://streamfilter_admin@127.0.0.1:PORT/streamfilter
# (no password; the line before it says which variable to set from $PG_RUN_DIR/password)
set -euo pipefail
# shellcheck source=deploy/postgres/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

pg_find_bin || exit "$EXIT_UNAVAILABLE"
mkdir -p "$PG_RUN_DIR"
exec 9>"$PG_RUN_DIR.lock"
flock 9
if pg_running; then
    pg_url
    exit 0
fi
if [ "${PG_KEEP_DATA:-0}" = 1 ] && [ -f "$PG_RUN_DIR/data/PG_VERSION" ] && [ -f "$PG_RUN_DIR/password" ]; then
    # the files `PG_KEEP_DATA=1 pg-down.sh` kept: start the same cluster again (same data,
    # port and password)
    pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_RUN_DIR/data" -l "$PG_RUN_DIR/postgres.log" -w \
        -t "$PG_START_TIMEOUT" start >/dev/null 9>&- || { tail -n 40 "$PG_RUN_DIR/postgres.log" >&2; exit 1; }
    pg_url
    exit 0
fi
rm -rf "$PG_RUN_DIR"
mkdir -p "$PG_RUN_DIR"
umask 077
head -c 18 /dev/urandom | base64 | tr '+/' '-_' >"$PG_RUN_DIR/password"
pg_as_owner "$PG_BIN/initdb" -D "$PG_RUN_DIR/data" -U streamfilter_admin --auth=scram-sha-256 \
    --pwfile="$PG_RUN_DIR/password" --encoding=UTF8 --locale=C.UTF-8 >"$PG_RUN_DIR/initdb.log" 2>&1 \
    || { cat "$PG_RUN_DIR/initdb.log" >&2; exit 1; }
cat >>"$PG_RUN_DIR/data/postgresql.conf" <<CONF
listen_addresses = '$PG_HOST'
port = $PG_PORT
unix_socket_directories = '$PG_RUN_DIR'
max_connections = 100
fsync = ${PG_FSYNC}
CONF
# loopback only, password (SCRAM) for every role: no trust, no peer
cat >"$PG_RUN_DIR/data/pg_hba.conf" <<CONF
host all all 127.0.0.1/32 scram-sha-256
local all all scram-sha-256
CONF
pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_RUN_DIR/data" -l "$PG_RUN_DIR/postgres.log" -w \
    -t "$PG_START_TIMEOUT" start >/dev/null 9>&- || { tail -n 40 "$PG_RUN_DIR/postgres.log" >&2; exit 1; }
PGPASSWORD="$(cat "$PG_RUN_DIR/password")" "$PG_BIN/psql" -q -h "$PG_HOST" -p "$PG_PORT" \
    -U streamfilter_admin -d postgres -v ON_ERROR_STOP=1 -c "CREATE DATABASE streamfilter" >/dev/null
pg_url
