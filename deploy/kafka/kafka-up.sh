#!/usr/bin/env bash
# Start a single-node Apache Kafka 4.x broker (KRaft, combined broker+controller) on 127.0.0.1,
# built from the Maven Central jars (see pom.xml). Progress goes to stderr; the last (and only)
# line on stdout is the bootstrap address, so `BOOTSTRAP=$(deploy/kafka/kafka-up.sh)` works.
#
#   deploy/kafka/kafka-up.sh [--keep-data]
#
#   --keep-data   reuse the data directory left by `kafka-down.sh --keep-data` (same cluster id,
#                 topics and offsets) instead of formatting a fresh one.
#
# Idempotent: if the broker for this port is already running, it only waits until it serves
# metadata and prints the address. Ports and other knobs: see common.sh (KAFKA_PORT,
# KAFKA_CONTROLLER_PORT, KAFKA_START_TIMEOUT, KAFKA_HEAP_OPTS, ...). Several brokers on
# different KAFKA_PORTs can run side by side (one .run/<port>/ directory each).
#
# Exit status: 0 ready, 1 failed to start, 2 bad arguments, 3 a prerequisite (java, mvn / the
# jars) is unavailable.
set -euo pipefail

# shellcheck source=deploy/kafka/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

keep_data=0
for arg in "$@"; do
    case "$arg" in
        --keep-data) keep_data=1 ;;
        -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        *) echo "kafka-up: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done
[[ "${KAFKA_KEEP_DATA:-0}" == 1 ]] && keep_data=1

START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"

# ---------------------------------------------------------------------------------------------
# Readiness probe: a Metadata request through kafka-python when some interpreter has it,
# otherwise "port accepts connections and the broker logged that it started".
PROBE_PYTHON=""
find_probe_python() {
    local c candidates=("$KAFKA_REPO_ROOT/.venv/bin/python" python3)
    [[ -z "${KAFKA_PYTHON:-}" ]] || candidates=("$KAFKA_PYTHON") # explicit choice only
    for c in "${candidates[@]}"; do
        command -v "$c" >/dev/null 2>&1 || continue
        if "$c" -c 'import kafka' >/dev/null 2>&1; then
            PROBE_PYTHON="$c"
            return 0
        fi
    done
    log "kafka-python not found (set KAFKA_PYTHON); readiness = port open + 'Kafka Server started' in the log"
}

PROBE_CONFIG=()
[[ "$KAFKA_SECURITY" != sasl_ssl ]] || PROBE_CONFIG=("$KAFKA_RUN_DIR/client.json")
LOG_OFFSET=0 # byte offset in kafka.log where the current broker's output starts
broker_ready() {
    port_open "$KAFKA_PORT" || return 1
    if [[ -n "$PROBE_PYTHON" ]]; then
        "$PROBE_PYTHON" "$KAFKA_HOME_DIR/probe.py" "$KAFKA_BOOTSTRAP_ADDR" "${PROBE_CONFIG[@]}" >/dev/null 2>&1
    else
        tail -c "+$((LOG_OFFSET + 1))" "$KAFKA_LOG_FILE" 2>/dev/null | grep -q 'Kafka Server started'
    fi
}

show_log_tail() {
    if [[ -f "$KAFKA_LOG_FILE" ]]; then
        echo "----- last lines of $KAFKA_LOG_FILE -----" >&2
        tail -c "+$((LOG_OFFSET + 1))" "$KAFKA_LOG_FILE" | tail -n 40 >&2
        echo "-----" >&2
    fi
}

# wait_ready PID: poll until the broker serves metadata; fail if it dies or the timeout passes.
wait_ready() {
    local pid="$1" deadline=$((SECONDS + START_TIMEOUT))
    while ! broker_ready; do
        if ! pid_alive "$pid"; then
            show_log_tail
            rm -f "$KAFKA_PID_FILE"
            die "the broker (pid $pid) exited during startup; full log: $KAFKA_LOG_FILE"
        fi
        if ((SECONDS >= deadline)); then
            show_log_tail
            log "not ready after ${START_TIMEOUT}s; stopping pid $pid"
            kill -KILL "$pid" 2>/dev/null || true
            rm -f "$KAFKA_PID_FILE"
            die "timed out after ${START_TIMEOUT}s waiting for $KAFKA_BOOTSTRAP_ADDR to answer a metadata request; full log: $KAFKA_LOG_FILE"
        fi
        sleep 0.5
    done
}

# ---------------------------------------------------------------------------------------------
# Jars: copied once by Maven into .cache/lib; re-provisioned when pom.xml or KAFKA_VERSION change.
provision_jars() {
    local stamp="$KAFKA_LIB_DIR/.provisioned" want mvn_log="$KAFKA_HOME_DIR/.cache/mvn.log"
    want="$(cksum <"$KAFKA_HOME_DIR/pom.xml") version=${KAFKA_VERSION:-pom}"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        return 0
    fi
    mkdir -p "$KAFKA_HOME_DIR/.cache"
    exec 8>"$KAFKA_HOME_DIR/.cache/provision.lock"
    if command -v flock >/dev/null 2>&1; then
        flock -w 900 8 || die "timed out waiting for another kafka-up to finish provisioning the jars"
    fi
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then # provisioned while we waited
        exec 8>&-
        return 0
    fi
    command -v "$MVN" >/dev/null 2>&1 ||
        unavailable "Maven ('$MVN') is not on PATH and the Kafka jars are not cached in $KAFKA_LIB_DIR"
    log "provisioning the Kafka jars with Maven into $KAFKA_LIB_DIR (cold: downloads ~50 MB into ~/.m2) ..."
    rm -rf "$KAFKA_LIB_DIR"
    local args=(-B -q -Dstyle.color=never -f "$KAFKA_HOME_DIR/pom.xml" dependency:copy-dependencies)
    [[ -z "${KAFKA_VERSION:-}" ]] || args+=("-Dkafka.version=$KAFKA_VERSION")
    if ! "$MVN" "${args[@]}" >"$mvn_log" 2>&1; then
        tail -n 30 "$mvn_log" >&2
        rm -rf "$KAFKA_LIB_DIR"
        unavailable "Maven could not provision the Kafka jars (no access to Maven Central?); full log: $mvn_log"
    fi
    compgen -G "$KAFKA_LIB_DIR/kafka_2.13-*.jar" >/dev/null ||
        unavailable "Maven succeeded but $KAFKA_LIB_DIR has no kafka_2.13 jar; see $mvn_log"
    echo "$want" >"$stamp"
    exec 8>&-
    log "jars ready: $(find "$KAFKA_LIB_DIR" -name '*.jar' | wc -l) jars, $(du -sh "$KAFKA_LIB_DIR" | cut -f1)"
}

# ---------------------------------------------------------------------------------------------
write_server_properties() {
    mkdir -p "$KAFKA_RUN_DIR"
    if [[ "$KAFKA_SECURITY" == sasl_ssl ]]; then
        write_secured_properties
        return
    fi
    cat >"$KAFKA_PROPS_FILE" <<EOF
# Generated by deploy/kafka/kafka-up.sh -- single-node KRaft broker for tests / local use.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$KAFKA_HOST:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://$KAFKA_HOST:$KAFKA_PORT,CONTROLLER://$KAFKA_HOST:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$KAFKA_HOST:$KAFKA_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs=$KAFKA_DATA_DIR

# Single node: every replication factor / ISR minimum is 1.
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Fewer internal partitions than the default 50: faster first group/transaction coordinator use.
offsets.topic.num.partitions=10
transaction.state.log.num.partitions=10

num.partitions=1
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
EOF
}

# ---------------------------------------------------------------------------------------------
# KAFKA_SECURITY=sasl_ssl: one SASL_SSL client listener, advertised as localhost:$KAFKA_PORT
# (TLS with a CA made here; SCRAM-SHA-512, SCRAM-SHA-256, PLAIN), ACLs enforced
# (StandardAuthorizer). Files in $KAFKA_TLS_DIR: ca.crt (the clients' ssl_cafile), client.crt +
# client.key (a client certificate; its key is encrypted with the password in
# client.key.password), server.* (the broker's; its certificate names DNS:localhost only).
# Users, made at format time: admin (super user, password admin-secret) and app (password
# app-secret; no rights until ACLs give some). The controller listener stays PLAINTEXT on
# 127.0.0.1: its principal, ANONYMOUS, is a super user (only the broker itself connects there).
KAFKA_TLS_DIR="$KAFKA_RUN_DIR/tls"
make_tls_files() {
    [[ -f "$KAFKA_TLS_DIR/server.p12" && -f "$KAFKA_TLS_DIR/client.key" ]] && return 0
    command -v openssl >/dev/null 2>&1 || unavailable "openssl is not on PATH (needed by KAFKA_SECURITY=sasl_ssl)"
    mkdir -p "$KAFKA_TLS_DIR"
    local d="$KAFKA_TLS_DIR"
    (
        set -e
        openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=streamfilter test CA" \
            -keyout "$d/ca.key" -out "$d/ca.crt"
        printf 'subjectAltName=DNS:localhost\n' >"$d/san.ext"
        openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$d/server.key" -out "$d/server.csr"
        openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
            -days 30 -extfile "$d/san.ext" -out "$d/server.crt"
        openssl pkcs12 -export -in "$d/server.crt" -inkey "$d/server.key" -name broker \
            -passout pass:broker-store -out "$d/server.p12"
        echo "client-key-secret" >"$d/client.key.password"
        openssl req -newkey rsa:2048 -subj "/CN=streamfilter-client" -passout pass:client-key-secret \
            -keyout "$d/client.key" -out "$d/client.csr"
        openssl x509 -req -in "$d/client.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
            -days 30 -out "$d/client.crt"
    ) >>"$KAFKA_LOG_FILE" 2>&1 || die "making the TLS files failed; see $KAFKA_LOG_FILE"
}

write_secured_properties() {
    make_tls_files
    cat >"$KAFKA_PROPS_FILE" <<EOF
# Generated by deploy/kafka/kafka-up.sh (KAFKA_SECURITY=sasl_ssl): secured single-node broker.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$KAFKA_HOST:$KAFKA_CONTROLLER_PORT
listeners=SASL_SSL://$KAFKA_HOST:$KAFKA_PORT,CONTROLLER://$KAFKA_HOST:$KAFKA_CONTROLLER_PORT
advertised.listeners=SASL_SSL://localhost:$KAFKA_PORT
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
inter.broker.listener.name=SASL_SSL
controller.listener.names=CONTROLLER
log.dirs=$KAFKA_DATA_DIR

sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="admin-secret";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" user_admin="admin-secret" user_app="app-secret";
ssl.keystore.type=PKCS12
ssl.keystore.location=$KAFKA_TLS_DIR/server.p12
ssl.keystore.password=broker-store
ssl.truststore.type=PEM
ssl.truststore.location=$KAFKA_TLS_DIR/ca.crt
ssl.client.auth=none

authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;User:ANONYMOUS
allow.everyone.if.no.acl.found=false

default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
offsets.topic.num.partitions=10
transaction.state.log.num.partitions=10
num.partitions=1
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
EOF
    cat >"$KAFKA_RUN_DIR/client.json" <<EOF
{"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "admin",
 "sasl_plain_password": "admin-secret", "ssl_cafile": "$KAFKA_TLS_DIR/ca.crt"}
EOF
}

new_cluster_id() { # 16 random bytes, base64url without padding (Kafka's Uuid text form)
    local id
    while :; do
        id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
        if [[ ${#id} == 22 && "$id" != -* ]]; then
            echo "$id"
            return 0
        fi
    done
}

format_storage() {
    local cluster_id scram=() user mech
    if [[ "$KAFKA_SECURITY" == sasl_ssl ]]; then
        for user in admin=admin-secret app=app-secret; do
            for mech in SCRAM-SHA-512 SCRAM-SHA-256; do
                scram+=(--add-scram "$mech=[name=${user%%=*},password=${user#*=}]")
            done
        done
    fi
    cluster_id="$(new_cluster_id)"
    rm -rf "$KAFKA_DATA_DIR"
    mkdir -p "$KAFKA_DATA_DIR"
    log "formatting $KAFKA_DATA_DIR (cluster id $cluster_id)"
    if ! "$JAVA" -Xmx256m -Dlog4j2.configurationFile="$KAFKA_HOME_DIR/log4j2.properties" \
        -cp "$KAFKA_LIB_DIR/*" kafka.tools.StorageTool \
        format --config "$KAFKA_PROPS_FILE" --cluster-id "$cluster_id" "${scram[@]}" \
        </dev/null >>"$KAFKA_LOG_FILE" 2>&1 9>&-; then
        show_log_tail
        die "formatting the storage failed; full log: $KAFKA_LOG_FILE"
    fi
}

start_broker() {
    local -a heap jvm_opts launcher=()
    read -r -a heap <<<"$HEAP_OPTS"
    read -r -a jvm_opts <<<"${KAFKA_JVM_OPTS:-}"
    command -v setsid >/dev/null 2>&1 && launcher=(setsid) # detach from the caller's Ctrl-C
    # fds: stdin from /dev/null, output to the log, lock fd 9 closed -- so neither a caller
    # capturing our stdout nor the next kafka-up/kafka-down waits on the broker.
    "${launcher[@]}" "$JAVA" "${heap[@]}" \
        -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
        -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$KAFKA_HOME_DIR/log4j2.properties" \
        "${jvm_opts[@]}" \
        -cp "$KAFKA_LIB_DIR/*" kafka.Kafka "$KAFKA_PROPS_FILE" \
        </dev/null >>"$KAFKA_LOG_FILE" 2>&1 8>&- 9>&- &
    echo $! >"$KAFKA_PID_FILE"
}

# ---------------------------------------------------------------------------------------------
command -v "$JAVA" >/dev/null 2>&1 || unavailable "Java ('$JAVA') is not on PATH (Kafka 4.x needs Java 17+)"

take_port_lock
find_probe_python

if pid="$(broker_pid)"; then
    log "already running (pid $pid)"
    wait_ready "$pid"
    echo "$KAFKA_BOOTSTRAP_ADDR"
    exit 0
fi

if port_open "$KAFKA_PORT"; then
    if [[ -n "$PROBE_PYTHON" ]] && broker_ready; then
        log "warning: a Kafka broker not started by kafka-up.sh already serves $KAFKA_BOOTSTRAP_ADDR; using it (kafka-down.sh will not stop it)"
        echo "$KAFKA_BOOTSTRAP_ADDR"
        exit 0
    fi
    die "port $KAFKA_PORT on $KAFKA_HOST is in use by another program; choose another KAFKA_PORT"
fi
port_open "$KAFKA_CONTROLLER_PORT" &&
    die "controller port $KAFKA_CONTROLLER_PORT on $KAFKA_HOST is in use; choose another KAFKA_PORT or KAFKA_CONTROLLER_PORT"

if [[ -f "$KAFKA_PID_FILE" ]]; then
    log "removing the pid file of a previous broker that is no longer running"
    rm -f "$KAFKA_PID_FILE"
fi

provision_jars

mkdir -p "$KAFKA_RUN_DIR"
touch "$KAFKA_LOG_FILE"
LOG_OFFSET="$(wc -c <"$KAFKA_LOG_FILE")"
echo "===== kafka-up $(date -u +%Y-%m-%dT%H:%M:%SZ) port=$KAFKA_PORT controller=$KAFKA_CONTROLLER_PORT keep_data=$keep_data =====" >>"$KAFKA_LOG_FILE"

write_server_properties
if ((keep_data)) && [[ -f "$KAFKA_DATA_DIR/meta.properties" ]]; then
    log "reusing the existing data in $KAFKA_DATA_DIR"
else
    ((keep_data)) && log "--keep-data: no formatted data in $KAFKA_DATA_DIR, formatting a fresh one"
    format_storage
fi

start_broker
pid="$(cat "$KAFKA_PID_FILE")"
log "started pid $pid; waiting up to ${START_TIMEOUT}s for $KAFKA_BOOTSTRAP_ADDR (log: $KAFKA_LOG_FILE)"
started_at=$SECONDS
wait_ready "$pid"
log "ready after $((SECONDS - started_at))s"
echo "$KAFKA_BOOTSTRAP_ADDR"
