#!/usr/bin/env bash
# Stop the broker started by kafka-up.sh on KAFKA_PORT (default 9092) and remove its data.
#
#   deploy/kafka/kafka-down.sh [--keep-data] [--purge]
#
#   --keep-data   only stop the broker; keep its data dir so `kafka-up.sh --keep-data` restarts
#                 the same cluster (topics, offsets, cluster id) -- used by outage tests.
#   --purge       also remove the whole .run/<port>/ directory, including kafka.log.
#
# SIGTERM first (controlled shutdown), SIGKILL after KAFKA_STOP_TIMEOUT seconds (default 30).
# Idempotent: with no broker running it only cleans up. A process on the port that kafka-up.sh
# did not start is left alone.
set -euo pipefail

# shellcheck source=deploy/kafka/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

keep_data=0
purge=0
for arg in "$@"; do
    case "$arg" in
        --keep-data) keep_data=1 ;;
        --purge) purge=1 ;;
        -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        *) echo "kafka-down: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done
[[ "${KAFKA_KEEP_DATA:-0}" == 1 ]] && keep_data=1
if ((keep_data && purge)); then
    echo "kafka-down: --keep-data and --purge are mutually exclusive" >&2
    exit 2
fi
STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"

take_port_lock

if pid="$(broker_pid)"; then
    log "stopping pid $pid (SIGTERM, SIGKILL after ${STOP_TIMEOUT}s)"
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + STOP_TIMEOUT))
    while pid_alive "$pid" && ((SECONDS < deadline)); do
        sleep 0.2
    done
    if pid_alive "$pid"; then
        log "still running after ${STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 10))
        while pid_alive "$pid" && ((SECONDS < deadline)); do
            sleep 0.2
        done
        pid_alive "$pid" && die "pid $pid survived SIGKILL"
    fi
    log "stopped"
else
    if port_open "$KAFKA_PORT"; then
        log "warning: $KAFKA_BOOTSTRAP_ADDR is served by a process kafka-up.sh did not start; leaving it alone"
    else
        log "not running"
    fi
fi
rm -f "$KAFKA_PID_FILE"

if ((purge)); then
    rm -rf "$KAFKA_RUN_DIR"
    rm -f "$KAFKA_LOCK_FILE"
elif ((keep_data)); then
    [[ -d "$KAFKA_DATA_DIR" ]] && log "kept data in $KAFKA_DATA_DIR"
else
    rm -rf "$KAFKA_DATA_DIR"
fi
exit 0
