# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this file
# Shared settings and helpers for kafka-up.sh / kafka-down.sh (sourced, not executed).
#
# Environment:
#   KAFKA_PORT             client (PLAINTEXT) port on 127.0.0.1          default 9092
#   KAFKA_CONTROLLER_PORT  KRaft controller port on 127.0.0.1            default KAFKA_PORT+1
#   KAFKA_START_TIMEOUT    seconds to wait for the broker to serve metadata   default 90
#   KAFKA_STOP_TIMEOUT     seconds between SIGTERM and SIGKILL          default 30
#   KAFKA_HEAP_OPTS        JVM heap options                  default "-Xms256m -Xmx512m"
#   KAFKA_JVM_OPTS         extra JVM options                                default empty
#   KAFKA_VERSION          Kafka release to provision          default: kafka.version in pom.xml
#   KAFKA_PYTHON           python with kafka-python for the readiness probe (only this one is
#                          tried when set; e.g. KAFKA_PYTHON=none forces the log-based check)
#                          default: <repo>/.venv/bin/python, then python3, if one imports kafka
#   KAFKA_SECURITY         "plaintext", or "sasl_ssl": TLS (a CA made by kafka-up.sh), SASL
#                          (SCRAM-SHA-512/256, PLAIN) and ACLs; the bootstrap address is then
#                          localhost:PORT (the certificate's name)           default plaintext
#   JAVA, MVN              java / mvn executables                     default: from PATH
#
# Layout (both directories are gitignored):
#   deploy/kafka/.cache/lib/    jars copied from ~/.m2 by Maven (shared by all brokers)
#   deploy/kafka/.run/<port>/   per-broker: server.properties, kafka.pid, kafka.log, data/

KAFKA_HOME_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA_REPO_ROOT="$(cd "$KAFKA_HOME_DIR/../.." && pwd)"
KAFKA_HOST=127.0.0.1

# Exit status meaning "a prerequisite (java, mvn, the jars) is missing": tests skip (or fail in CI).
EXIT_UNAVAILABLE=3

KAFKA_PORT="${KAFKA_PORT:-9092}"
if ! [[ "$KAFKA_PORT" =~ ^[0-9]+$ ]] || ((KAFKA_PORT < 1 || KAFKA_PORT > 65534)); then
    echo "kafka: error: KAFKA_PORT must be a port number in 1..65534, got '$KAFKA_PORT'" >&2
    exit 2
fi
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}"
if ! [[ "$KAFKA_CONTROLLER_PORT" =~ ^[0-9]+$ ]] || ((KAFKA_CONTROLLER_PORT < 1 || KAFKA_CONTROLLER_PORT > 65535)) \
    || ((KAFKA_CONTROLLER_PORT == KAFKA_PORT)); then
    echo "kafka: error: KAFKA_CONTROLLER_PORT must be a port number different from KAFKA_PORT, got '$KAFKA_CONTROLLER_PORT'" >&2
    exit 2
fi
KAFKA_SECURITY="${KAFKA_SECURITY:-plaintext}"
case "$KAFKA_SECURITY" in
    plaintext) KAFKA_BOOTSTRAP_ADDR="$KAFKA_HOST:$KAFKA_PORT" ;;
    sasl_ssl) KAFKA_BOOTSTRAP_ADDR="localhost:$KAFKA_PORT" ;;
    *) echo "kafka: error: KAFKA_SECURITY must be plaintext or sasl_ssl, got '$KAFKA_SECURITY'" >&2; exit 2 ;;
esac

KAFKA_LIB_DIR="$KAFKA_HOME_DIR/.cache/lib"
KAFKA_RUN_DIR="$KAFKA_HOME_DIR/.run/$KAFKA_PORT"
KAFKA_DATA_DIR="$KAFKA_RUN_DIR/data"
KAFKA_PID_FILE="$KAFKA_RUN_DIR/kafka.pid"
KAFKA_LOG_FILE="$KAFKA_RUN_DIR/kafka.log"
KAFKA_PROPS_FILE="$KAFKA_RUN_DIR/server.properties"
KAFKA_LOCK_FILE="$KAFKA_HOME_DIR/.run/$KAFKA_PORT.lock"

JAVA="${JAVA:-java}"
MVN="${MVN:-mvn}"

log() { echo "kafka[$KAFKA_PORT]: $*" >&2; }
die() { echo "kafka[$KAFKA_PORT]: error: $*" >&2; exit 1; }
unavailable() { echo "kafka[$KAFKA_PORT]: unavailable: $*" >&2; exit "$EXIT_UNAVAILABLE"; }

# Serialise kafka-up/kafka-down for one port (fd 9 stays open for the caller's lifetime).
take_port_lock() {
    mkdir -p "$KAFKA_HOME_DIR/.run"
    exec 9>"$KAFKA_LOCK_FILE"
    if command -v flock >/dev/null 2>&1; then
        flock -w 300 9 || die "timed out waiting for the lock $KAFKA_LOCK_FILE"
    fi
}

# PID of the broker recorded for this port, if that process is alive and really is our broker
# (guards against a stale pid file whose pid was reused by an unrelated process).
broker_pid() {
    local pid
    [[ -f "$KAFKA_PID_FILE" ]] || return 1
    pid="$(cat "$KAFKA_PID_FILE" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    pid_alive "$pid" || return 1
    if [[ -r "/proc/$pid/cmdline" ]]; then
        tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$KAFKA_PROPS_FILE" || return 1
    fi
    echo "$pid"
}

# True if something accepts TCP connections on 127.0.0.1:$1.
port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/$KAFKA_HOST/$1" 2>/dev/null
}

# True if pid $1 exists and is not a zombie (an orphaned broker may never be reaped if PID 1
# does not reap, and kill -0 succeeds on zombies).
pid_alive() {
    kill -0 "$1" 2>/dev/null || return 1
    if [[ -r "/proc/$1/stat" ]]; then
        local stat
        stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
        stat="${stat##*) }"
        [[ "${stat:0:1}" != Z ]] || return 1
    fi
    return 0
}
