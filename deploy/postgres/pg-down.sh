#!/usr/bin/env bash
# Stop the throw-away PostgreSQL cluster started by pg-up.sh and delete its files.
set -euo pipefail
# shellcheck source=deploy/postgres/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

pg_find_bin || exit 0
if [ -d "$PG_RUN_DIR/data" ] && pg_running; then
    pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_RUN_DIR/data" -m fast -w -t "$PG_STOP_TIMEOUT" stop >/dev/null \
        || pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_RUN_DIR/data" -m immediate -w stop >/dev/null || true
fi
if [ "${PG_KEEP_DATA:-0}" != 1 ]; then
    rm -rf "$PG_RUN_DIR" "$PG_RUN_DIR.lock"
fi
