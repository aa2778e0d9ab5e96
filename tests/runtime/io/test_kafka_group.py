"""Group membership as the coordinator tells it (``runtime/io/kafka_group.py``), on the real test
broker: two workers' group sources in one group; a worker that closed its consumer has left, one
that is a member or was never seen has not."""

from __future__ import annotations

import contextlib
import time

import pytest

from streamfilter.runtime.io.kafka import KafkaGroupSource
from tests.support.kafka_broker import admin_client, create_topic, unique_topic

pytestmark = pytest.mark.kafka


def group_source(bootstrap: str, topic: str, group: str, name: str) -> KafkaGroupSource:
    client = {"bootstrap_servers": bootstrap, "client_id": "streamfilter"}
    return KafkaGroupSource(
        topic,
        client,
        group,
        member_name=name,
        session_timeout_s=6.0,
        heartbeat_interval_s=1.0,
        poll_timeout_ms=200,
    )


def poll_until(sources, condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        states = [(s.partitions(), s.consumer.group_metadata()) for s in sources]
        assert time.monotonic() < deadline, f"the group did not settle: {states}"
        for source in sources:
            source.poll_batches(100)


@pytest.mark.timeout(180)
def test_a_worker_that_closed_its_consumer_has_left_the_group(kafka_bootstrap):
    topic = create_topic(kafka_bootstrap, unique_topic("events"), partitions=2)
    group = unique_topic("group")
    a = group_source(kafka_bootstrap, topic, group, "host:1:aaaaaa")
    b = group_source(kafka_bootstrap, topic, group, "host:2:bbbbbb")
    try:
        poll_until([a, b], lambda: len(a.partitions()) == 1 and len(b.partitions()) == 1)
        admin = admin_client(kafka_bootstrap)
        try:
            members = admin.describe_groups([group])[group]["members"]
        finally:
            admin.close()
        # each consumer's client id carries its worker's name after the configured client id
        assert sorted(m["client_id"] for m in members) == [
            "streamfilter-host:1:aaaaaa",
            "streamfilter-host:2:bbbbbb",
        ]
        assert not b.membership.has_left("host:1:aaaaaa")  # a member
        assert not b.membership.has_left("host:9:never0")  # never seen: no evidence
        assert not a.membership.has_left("host:2:bbbbbb")
        generation = b.consumer.group_metadata().generation_id
        a.close()  # LeaveGroup: the group rebalances at once
        closed = time.monotonic()
        poll_until(
            [b],
            lambda: (
                b.consumer.group_metadata().generation_id > generation and len(b.partitions()) == 2
            ),
        )
        deadline = time.monotonic() + 10
        while not b.membership.has_left("host:1:aaaaaa"):
            assert time.monotonic() < deadline, "the closed worker is still a member"
            b.poll_batches(100)
        assert time.monotonic() - closed < 10  # well before its 6 s session would expire + lease
        assert not b.membership.has_left("host:9:never0")
    finally:
        for source in (a, b):
            with contextlib.suppress(Exception):  # a was closed already
                source.close()
