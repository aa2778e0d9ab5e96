"""The test Kafka broker itself: a real round trip, and a stop/restart that keeps the data."""

from __future__ import annotations

import socket
from collections import defaultdict

import pytest
from kafka import KafkaProducer

from tests.support.kafka_broker import (
    KafkaBroker,
    broker_control,
    create_topic,
    read_topic,
    unique_topic,
    wait_for_broker,
)

pytestmark = pytest.mark.kafka

# Generous bounds: the first test may include a cold Maven download of the broker jars.
TIMEOUT_S = 420


def produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> list:
    """Send ``messages`` with an idempotent acks=all producer; returns their RecordMetadata."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id="test-kafka-broker",
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        max_block_ms=30_000,
        request_timeout_ms=30_000,
    )
    try:
        assert producer.config["enable_idempotence"] is True
        futures = [producer.send(topic, key=key, value=value) for key, value in messages]
        producer.flush(timeout=60)
        return [future.get(timeout=30) for future in futures]
    finally:
        producer.close(timeout=10)


def as_layout(metadata: list, messages: list[tuple[bytes, bytes]]) -> dict:
    """{(partition, offset): (key, value)} as acknowledged by the broker."""
    return {(m.partition, m.offset): kv for m, kv in zip(metadata, messages, strict=True)}


def port_accepts(bootstrap: str) -> bool:
    host, port = bootstrap.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


@pytest.mark.timeout(TIMEOUT_S)
def test_keyed_roundtrip_three_partitions(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, unique_topic("roundtrip"), partitions=3)
    messages = [(f"user-{i % 10}".encode(), f"event-{i:03d}".encode()) for i in range(100)]

    metadata = produce(kafka_bootstrap, topic, messages)
    produced = as_layout(metadata, messages)
    assert len(produced) == 100  # 100 distinct (partition, offset) slots
    assert {m.partition for m in metadata} == {0, 1, 2}
    # Idempotent, in-order delivery: each partition holds exactly offsets 0..n-1.
    per_partition = defaultdict(list)
    for m in metadata:
        per_partition[m.partition].append(m.offset)
    for offsets in per_partition.values():
        assert offsets == list(range(len(offsets)))

    records = read_topic(kafka_bootstrap, topic, timeout=60)
    consumed = {(r.partition, r.offset): (r.key, r.value) for r in records}
    assert consumed == produced  # exact content, nothing missing, nothing extra

    # A key always lands on one partition, in production order.
    by_key = defaultdict(list)
    for r in records:
        by_key[r.key].append((r.partition, r.value))
    for key, seen in by_key.items():
        assert len({p for p, _ in seen}) == 1
        assert [v for _, v in seen] == [v for k, v in messages if k == key]


@pytest.mark.timeout(TIMEOUT_S)
def test_stop_and_restart_preserves_data(kafka_private_broker: KafkaBroker) -> None:
    broker = kafka_private_broker
    bootstrap = broker.bootstrap
    assert broker_control(bootstrap) is broker
    assert broker.start() == bootstrap  # idempotent while running

    cluster_id = wait_for_broker(bootstrap)["cluster_id"]
    topic = create_topic(bootstrap, unique_topic("restart"), partitions=2)
    before = [(f"k{i % 4}".encode(), f"before-{i}".encode()) for i in range(20)]
    layout = as_layout(produce(bootstrap, topic, before), before)

    broker.stop(keep_data=True)
    assert not broker.is_running()
    assert not port_accepts(bootstrap)

    assert broker.start(keep_data=True) == bootstrap
    assert broker.is_running()
    assert wait_for_broker(bootstrap)["cluster_id"] == cluster_id

    consumed = {(r.partition, r.offset): (r.key, r.value) for r in read_topic(bootstrap, topic)}
    assert consumed == layout

    # The log continues where it stopped: new offsets follow the old ones, per partition.
    after = [(f"k{i % 4}".encode(), f"after-{i}".encode()) for i in range(10)]
    layout.update(as_layout(produce(bootstrap, topic, after), after))
    consumed = {(r.partition, r.offset): (r.key, r.value) for r in read_topic(bootstrap, topic)}
    assert consumed == layout
    for partition in {p for p, _ in layout}:
        offsets = sorted(o for p, o in layout if p == partition)
        assert offsets == list(range(len(offsets)))

    broker.restart()
    assert len(read_topic(bootstrap, topic)) == 30
