"""Daemon throughput on Kafka next to a bare kafka-python consumer loop on the same topic.

A single-node broker is started from ``deploy/kafka`` (or ``KAFKA_BOOTSTRAP`` is used), one
events topic with 3 partitions is filled with ``n`` events, then in one run:

* baseline: a bare ``KafkaConsumer`` assigned to all partitions, polling until the end offsets
  (decoding nothing) — the ceiling any Kafka consumer in Python can reach here;
* streamfilter: the real daemon (``build_daemon`` + ``run(until_end=True)``) over the same topic:
  validation, accumulation, day closes with 3 standing queries, SQLite commits, releases
  published to a Kafka topic with acks=all.

Both are timed in-process (Python start-up excluded); the median of ``repeats`` runs is reported.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

ROOT = Path(__file__).resolve().parents[1]


def _broker() -> tuple[str, bool]:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        return os.environ["KAFKA_BOOTSTRAP"], False
    env = {**os.environ, "KAFKA_PORT": "19392"}
    out = subprocess.run(
        [str(ROOT / "deploy/kafka/kafka-up.sh")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1], True


def _stop_broker() -> None:
    env = {**os.environ, "KAFKA_PORT": "19392"}
    subprocess.run(
        [str(ROOT / "deploy/kafka/kafka-down.sh")], env=env, capture_output=True, check=False
    )


def _fill(bootstrap: str, topic: str, n: int, days: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 3, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=256_000)
    per_day = n // days
    for i in range(n):
        day = f"2026-01-{1 + min(i // per_day, days - 1):02d}"
        user = f"u-{i % (per_day or 1)}"
        value = json.dumps(
            {
                "user_id": user,
                "day": day,
                "values": {"active": 1, "minutes": float(i % 90), "plan": "pro"},
            }
        ).encode()
        producer.send(topic, key=user.encode(), value=value)
    producer.flush()
    producer.close()


def _bare_consumer(bootstrap: str, topic: str) -> tuple[float, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    end = consumer.end_offsets(tps)
    count = 0
    t0 = time.perf_counter()
    while any(consumer.position(tp) < end[tp] for tp in tps):
        for batch in consumer.poll(timeout_ms=500, max_records=50_000).values():
            count += len(batch)
    elapsed = time.perf_counter() - t0
    consumer.close()
    return elapsed, count


def _daemon(
    bootstrap: str, topic: str, releases: str, queries_file: Path, work: Path
) -> tuple[float, int]:
    from streamfilter.config import load_config
    from streamfilter.runtime.app import build_daemon

    cfg = work / f"{uuid.uuid4().hex}.toml"
    cfg.write_text(
        f"""
[privacy]
b_norm = 8.0
rho = 0.5
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "bench-{uuid.uuid4().hex[:8]}"
[source]
kind = "kafka"
topic = "{topic}"
[queries]
kind = "file"
path = "{queries_file}"
[sink]
kind = "kafka"
topic = "{releases}"
[rejects]
kind = "file"
path = "{work / "rejects.jsonl"}"
[state]
path = "{work / (uuid.uuid4().hex + ".db")}"
"""
    )
    parts = build_daemon(load_config(cfg), follow=False)
    t0 = time.perf_counter()
    try:
        summary = parts.daemon.run(until_end=True)
    finally:
        parts.close()
    return time.perf_counter() - t0, summary.records_read


def run(quick: bool = False) -> list[dict[str, object]]:
    n = 50_000 if quick else 300_000
    repeats = 3 if quick else 5
    bootstrap, started = _broker()
    try:
        topic = f"bench-events-{uuid.uuid4().hex[:8]}"
        releases = f"bench-releases-{uuid.uuid4().hex[:8]}"
        _fill(bootstrap, topic, n, days=5)
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic(releases, 1, 1)])
        admin.close()
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            queries = work / "queries.jsonl"
            queries.write_text(
                "\n".join(
                    json.dumps(q)
                    for q in [
                        {
                            "query_id": "active",
                            "kind": "sum",
                            "features": ["active"],
                            "clip": 1.0,
                            "from_day": "2026-01-01",
                        },
                        {
                            "query_id": "plans",
                            "kind": "histogram",
                            "feature": "plan",
                            "categories": ["free", "pro", "team"],
                            "clip": 1.0,
                            "from_day": "2026-01-01",
                        },
                        {
                            "query_id": "hours",
                            "kind": "linear",
                            "weights": {"minutes": [1 / 60]},
                            "clip": 1.0,
                            "from_day": "2026-01-01",
                        },
                    ]
                )
                + "\n"
            )
            bare, daemon = [], []
            for _ in range(repeats):
                s, c = _bare_consumer(bootstrap, topic)
                assert c == n
                bare.append(c / s)
                s, c = _daemon(bootstrap, topic, releases, queries, work)
                assert c == n
                daemon.append(c / s)
    finally:
        if started:
            _stop_broker()
    value, base = statistics.median(daemon), statistics.median(bare)
    return [
        {
            "name": "kafka_vs_bare_consumer",
            "value": round(value),
            "unit": "events/s",
            "baseline": "bare kafka-python consumer loop, same topic (3 partitions)",
            "baseline_value": round(base),
            "ratio": round(value / base, 3),
            "detail": f"{n} events, 5 days, 3 standing queries; median of {repeats}",
        }
    ]


if __name__ == "__main__":
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
