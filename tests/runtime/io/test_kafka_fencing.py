"""Fenced publishing: releases go out in Kafka transactions under the
releases topic's own transactional id, so a second instance fences the first and only then
compares the topic with its state.

The instances run without a test seed: each draws its own noise, so a (day, query) published by
both would show two values. A ``read_committed`` reader must see exactly one per key."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict

import pytest

from tests.runtime.io.test_kafka_daemon import (
    QUERIES,
    cli,
    config_text,
    make_events,
    spawn,
    unique_topic,
    wait_for_release,
)

pytestmark = pytest.mark.kafka


def private_config(topics, bootstrap) -> str:
    """The Kafka configuration of test_kafka_daemon without the test seed (real noise)."""
    text = config_text("kafka", topics, bootstrap)
    return text.replace("[testing]\nnoise_seed = 5\n", "")


def produce(bootstrap, topic, events):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for ev in events:
        producer.send(topic, key=json.loads(ev)["user_id"].encode(), value=ev)
    producer.flush()
    producer.close()


def of_days(events, days):
    return [e for e in events if e.startswith(b'{"') and json.loads(e)["day"] in days]


def values_by_key(bootstrap, topic, isolation_level="read_committed"):
    from tests.support.kafka_broker import read_topic

    by_key = defaultdict(set)
    for rec in read_topic(bootstrap, topic, timeout=60, isolation_level=isolation_level):
        obj = json.loads(rec.value)
        assert rec.key.decode() == f"{obj['day']}/{obj['query_id']}"
        by_key[(obj["day"], obj["query_id"])].add(rec.value)
    return by_key


def wait_exit(proc, timeout):
    try:
        return proc.wait(timeout=timeout)
    except Exception:
        proc.send_signal(9)
        raise AssertionError(f"did not exit within {timeout}s:\n{proc.tail()}") from None


@pytest.mark.parametrize("second_state", ["empty", "copy"])
@pytest.mark.timeout(300)
def test_a_second_instance_fences_the_first_and_each_release_has_one_value(
    kafka_bootstrap, tmp_path, second_state
):
    from kafka import KafkaProducer

    events = make_events(days=4, users=150, seed=7)
    topics = {k: unique_topic(k) for k in ("events", "queries", "releases", "rejects")}
    first, second = tmp_path / "first", tmp_path / "second"
    for work in (first, second):
        work.mkdir()
        (work / "streamfilter.toml").write_text(private_config(topics, kafka_bootstrap))
    cli(["topics", "create", "--config", "streamfilter.toml"], cwd=first)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    for q in QUERIES:
        producer.send(topics["queries"], value=json.dumps(q).encode())
    producer.close()
    run_once = ["run", "--config", "streamfilter.toml", "--until-end"]
    produce(kafka_bootstrap, topics["events"], of_days(events, {"2026-01-01"}))
    cli(run_once, cwd=first)  # day 1 published; its state is the copy the second may start from
    if second_state == "copy":
        for name in ("state.db", "state.db.seq"):
            shutil.copy(first / name, second / name)

    # the first instance follows the stream and publishes days 2 and 3
    produce(kafka_bootstrap, topics["events"], of_days(events, {"2026-01-02", "2026-01-03"}))
    running = spawn(["run", "--config", "streamfilter.toml"], cwd=first)
    try:
        wait_for_release(kafka_bootstrap, topics["releases"], ("2026-01-03", "active"), 120)
        assert running.poll() is None, running.tail()
        # the second instance fences it, then finds the topic ahead of its state: refuses
        proc = cli(run_once, cwd=second, check=False, timeout=120)
        assert proc.returncode == 4, proc.stderr
        assert "stale" in proc.stderr and "2026-01-03" in proc.stderr
        assert "Traceback" not in proc.stderr
        # the first can no longer publish: day 4 closes, its transaction is refused
        produce(kafka_bootstrap, topics["events"], of_days(events, {"2026-01-04"}))
        produce(
            kafka_bootstrap,
            topics["events"],
            [
                json.dumps(
                    {"user_id": "late", "day": "2026-02-01", "values": {"active": 1}}
                ).encode()
            ],
        )
        assert wait_exit(running, 90) == 7, running.tail()
    finally:
        if running.poll() is None:
            running.send_signal(9)
    log = running.tail()
    assert "fenced" in log and topics["releases"] in log and "Traceback" not in log
    got = values_by_key(kafka_bootstrap, topics["releases"])
    assert {day for day, _ in got} == {"2026-01-01", "2026-01-02", "2026-01-03"}
    assert all(len(values) == 1 for values in got.values()), got
