"""Readiness probe for kafka-up.sh: one Metadata request via kafka-python.

Usage: python probe.py HOST:PORT [CLIENT_JSON]
(CLIENT_JSON: a file of extra kafka-python settings, e.g. SASL_SSL for KAFKA_SECURITY=sasl_ssl)
Exit status: 0 = the broker answered with at least one registered broker (prints the cluster
id), 1 = not (yet) serving, 2 = kafka-python is not importable in this interpreter.
"""

import logging
import sys


def main() -> int:
    bootstrap = sys.argv[1]
    extra = {}
    if len(sys.argv) > 2:
        import json

        with open(sys.argv[2]) as f:
            extra = json.load(f)
    try:
        from kafka import KafkaAdminClient
    except ImportError:
        return 2
    logging.disable(logging.CRITICAL)  # kafka-python logs every refused connection
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="kafka-up-probe",
            request_timeout_ms=5000,
            bootstrap_timeout_ms=3000,
            reconnect_backoff_max_ms=500,
            **extra,
        )
    except Exception:
        return 1
    try:
        cluster = admin.describe_cluster()
    except Exception:
        return 1
    finally:
        admin.close()
    if not cluster.get("brokers"):
        return 1
    print(cluster.get("cluster_id") or "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
