# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this file
# Shared settings for pg-up.sh / pg-down.sh (sourced, not executed).
#
# Environment:
#   PG_PORT           TCP port on 127.0.0.1                        default 55432
#   PG_RUN_DIR        cluster directory (data, socket, log, password) default $TMPDIR/streamfilter-pg-<port>
#   PG_START_TIMEOUT  seconds to wait for the server                default 60
#   PG_STOP_TIMEOUT   seconds before an immediate shutdown          default 30
#   PG_FSYNC          fsync setting (tests may turn it off)         default on
#   PG_BIN            PostgreSQL's bin directory                    default: pg_config --bindir,
#                                                                   else /usr/lib/postgresql/<newest>/bin
PG_HOME_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PG_HOST=127.0.0.1
EXIT_UNAVAILABLE=3
PG_PORT="${PG_PORT:-55432}"
if ! [[ "$PG_PORT" =~ ^[0-9]+$ ]] || ((PG_PORT < 1 || PG_PORT > 65535)); then
    echo "postgres: error: PG_PORT must be a port number, got '$PG_PORT'" >&2
    exit 2
fi
PG_RUN_DIR="${PG_RUN_DIR:-${TMPDIR:-/tmp}/streamfilter-pg-$PG_PORT}"
PG_START_TIMEOUT="${PG_START_TIMEOUT:-60}"
PG_STOP_TIMEOUT="${PG_STOP_TIMEOUT:-30}"
PG_FSYNC="${PG_FSYNC:-on}"

pg_find_bin() {
    if [ -n "${PG_BIN:-}" ] && [ -x "$PG_BIN/initdb" ]; then return 0; fi
    local dir
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$dir/initdb" ]; then PG_BIN="$dir"; return 0; fi
    done
    echo "postgres: PostgreSQL server binaries not found (Debian package 'postgresql'; make test-deps installs it)" >&2
    return 1
}

# initdb and postgres refuse to run as root: run them as the cluster directory's owner
pg_as_owner() {
    if [ "$(id -u)" = 0 ]; then
        local owner="${PG_OWNER:-postgres}"
        chown -R "$owner" "$PG_RUN_DIR"
        runuser -u "$owner" -- "$@"
    else
        "$@"
    fi
}

pg_running() {
    [ -f "$PG_RUN_DIR/data/postmaster.pid" ] && pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_RUN_DIR/data" status >/dev/null 2>&1
}

# The password is never printed: the URL names the server, the variable line says where the
# password is (state.url refuses a URL with one; state.password_env names the variable).
pg_url() {
    echo "# password: export STREAMFILTER_PG_PASSWORD=\"\$(cat $PG_RUN_DIR/password)\" and set state.password_env = \"STREAMFILTER_PG_PASSWORD\""
    echo "postgresql://streamfilter_admin@$PG_HOST:$PG_PORT/streamfilter"
}
