"""Shared pieces of the chaos suite: a daemon configuration on a real broker, a file-path
reference run of the same valid events under the same test seed, and producers."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.runtime.io.test_kafka_daemon import cli
from tests.support.kafka_broker import create_topic, unique_topic

QUERY = {"query_id": "n", "kind": "sum", "features": ["n"], "clip": 1.0, "from_day": "2026-01-01"}
BIG = str(100 << 20)  # max.message.bytes of topics that must carry hostile giants

HEAD = """
[privacy]
b_norm = 2.0
rho = 0.5
granularity = 0.00390625
[testing]
noise_seed = 11
[state]
path = "state.db"
[window]
allowed_lateness = "0s"
idle_timeout = "{idle}"
poll_interval = "0.2s"
"""


def events(days: list[str], per_day: int, seed: int = 0, prefix: str = "u") -> list[bytes]:
    rng = random.Random(seed)
    return [
        json.dumps(
            {"user_id": f"{prefix}{rng.randrange(10**9)}", "day": day, "values": {"n": 1}}
        ).encode()
        for day in days
        for _ in range(per_day)
    ]


def reference(tmp: Path, lines: list[bytes], queries=(QUERY,)) -> list[bytes]:
    """The releases of ``lines`` read from a file with ``--until-end`` (in day order)."""
    ref = tmp / "reference"
    ref.mkdir()
    (ref / "streamfilter.toml").write_text(
        HEAD.format(idle="3s")
        + '[source]\nkind = "file"\npath = "events.jsonl"\n'
        + '[queries]\nkind = "file"\npath = "queries.jsonl"\n'
        + '[sink]\nkind = "file"\npath = "releases.jsonl"\n'
    )
    (ref / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (ref / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    cli(["run", "--config", "streamfilter.toml", "--until-end", "--testing"], cwd=ref)
    return (ref / "releases.jsonl").read_bytes().splitlines()


def kafka_world(
    tmp: Path,
    bootstrap: str,
    *,
    partitions: int = 1,
    big: bool = False,
    idle: str = "3s",
    extra: str = "",
) -> tuple[Path, dict[str, str]]:
    """Topics (events, queries, releases, rejects) and a config in ``tmp/kafka``."""
    work = tmp / "kafka"
    work.mkdir()
    topics = {k: unique_topic(k) for k in ("events", "queries", "releases", "rejects")}
    for role, name in topics.items():
        configs = {"max.message.bytes": BIG} if big and role in ("events", "queries") else None
        create_topic(bootstrap, name, partitions if role == "events" else 1, configs=configs)
    (work / "streamfilter.toml").write_text(
        HEAD.format(idle=idle)
        + f"""
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "sf-{topics["events"]}"
[source]
kind = "kafka"
topic = "{topics["events"]}"
[queries]
kind = "kafka"
topic = "{topics["queries"]}"
[sink]
kind = "kafka"
topic = "{topics["releases"]}"
[rejects]
kind = "kafka"
topic = "{topics["rejects"]}"
"""
        + extra
    )
    return work, topics


def produce(
    bootstrap: str, topic: str, values: list[bytes], partition: int | None = None, big=False
) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        max_request_size=int(BIG) if big else 1_048_576,
    )
    for value in values:
        producer.send(topic, value=value, partition=partition)
    producer.flush()
    producer.close()


def release_values(bootstrap: str, topic: str) -> list[bytes]:
    """The releases topic's values, one per key, in (day, query) order; asserts no key holds
    two different values."""
    from tests.support.kafka_broker import read_topic

    by_key: dict[str, set[bytes]] = {}
    for rec in read_topic(bootstrap, topic, timeout=60):
        by_key.setdefault(rec.key.decode(), set()).add(rec.value)
    assert all(len(v) == 1 for v in by_key.values()), "two values for one (day, query)"
    return [next(iter(by_key[k])) for k in sorted(by_key)]
