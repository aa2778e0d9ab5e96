"""Fenced publishing: releases go out in Kafka transactions under the
releases topic's own transactional id. A second instance compares the topic with its state
before it fences anyone (a stale copy is refused and the running instance keeps publishing),
takes the topic over (fencing the first) only if its state is current, and compares again.

The instances run without a test seed: each draws its own noise, so a (day, query) published by
both would show two values. A ``read_committed`` reader must see exactly one per key."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
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


def start_two(kafka_bootstrap, tmp_path):
    """Topics, queries, day 1 published by a first instance run to the end; returns the topics,
    the events, the first and second work directories and the first's day-1 state copied."""
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
    produce(kafka_bootstrap, topics["events"], of_days(events, {"2026-01-01"}))
    cli(RUN_ONCE, cwd=first)  # day 1 published
    return topics, events, first, second


RUN_ONCE = ["run", "--config", "streamfilter.toml", "--until-end"]
LATE = json.dumps({"user_id": "late", "day": "2026-02-01", "values": {"active": 1}}).encode()


@pytest.mark.parametrize("second_state", ["empty", "copy"])
@pytest.mark.timeout(300)
def test_a_stale_second_instance_is_refused_before_it_fences_the_running_one(
    kafka_bootstrap, tmp_path, second_state
):
    """A second instance from an empty state or an old copy reads the topic before it fences
    anyone: it exits 4 and the running instance keeps publishing."""
    topics, events, first, second = start_two(kafka_bootstrap, tmp_path)
    if second_state == "copy":
        for name in ("state.db", "state.db.seq"):
            shutil.copy(first / name, second / name)

    # the first instance follows the stream and publishes days 2 and 3
    produce(kafka_bootstrap, topics["events"], of_days(events, {"2026-01-02", "2026-01-03"}))
    running = spawn(["run", "--config", "streamfilter.toml"], cwd=first)
    try:
        wait_for_release(kafka_bootstrap, topics["releases"], ("2026-01-03", "active"), 120)
        assert running.poll() is None, running.tail()
        proc = cli(RUN_ONCE, cwd=second, check=False, timeout=120)
        assert proc.returncode == 4, proc.stderr
        assert "stale" in proc.stderr and "2026-01-03" in proc.stderr
        assert "Traceback" not in proc.stderr
        # the first still publishes: day 4 closes (a later day's event moves the watermark)
        produce(kafka_bootstrap, topics["events"], [*of_days(events, {"2026-01-04"}), LATE])
        wait_for_release(kafka_bootstrap, topics["releases"], ("2026-01-04", "active"), 120)
        assert running.poll() is None, running.tail()
    finally:
        if running.poll() is None:
            running.send_signal(15)
        wait_exit(running, 90)
    log = running.tail()
    assert "fenced" not in log and "Traceback" not in log, log
    got = values_by_key(kafka_bootstrap, topics["releases"])
    # days 1 to 4, and the empty days the late event closed after them
    assert {"2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"} <= {day for day, _ in got}
    assert all(len(values) == 1 for values in got.values()), got


@pytest.mark.timeout(300)
def test_a_current_second_instance_fences_the_first_and_each_release_has_one_value(
    kafka_bootstrap, tmp_path
):
    """A second instance whose state is as new as the topic takes the topic over: the first
    is fenced (exit 7) at its next publication; every release still has one value."""
    topics, events, first, second = start_two(kafka_bootstrap, tmp_path)
    produce(kafka_bootstrap, topics["events"], of_days(events, {"2026-01-02", "2026-01-03"}))
    running = spawn(["run", "--config", "streamfilter.toml"], cwd=first)
    try:
        wait_for_release(kafka_bootstrap, topics["releases"], ("2026-01-03", "active"), 120)
        # a consistent copy of the running state (SQLite's online backup) and its mirror
        deadline = time.monotonic() + 60
        while True:  # the first's mirror follows its commit: wait until both say day 3
            src = sqlite3.connect(first / "state.db")
            try:
                last = src.execute(
                    "SELECT value FROM meta WHERE key = 'last_closed_day'"
                ).fetchone()
                if (
                    last
                    and last[0] == "2026-01-03"
                    and '"2026-01-03"' in (first / "state.db.seq").read_text()
                ):
                    dst = sqlite3.connect(second / "state.db")
                    src.backup(dst)
                    dst.close()
                    shutil.copy(first / "state.db.seq", second / "state.db.seq")
                    break
            finally:
                src.close()
            assert time.monotonic() < deadline, "the first never recorded day 3"
            time.sleep(0.5)
        proc = cli(RUN_ONCE, cwd=second, check=False, timeout=120)
        assert proc.returncode == 0, proc.stderr
        # the first can no longer publish: day 4 closes, its transaction is refused
        produce(kafka_bootstrap, topics["events"], [*of_days(events, {"2026-01-04"}), LATE])
        assert wait_exit(running, 90) == 7, running.tail()
    finally:
        if running.poll() is None:
            running.send_signal(9)
    log = running.tail()
    assert "fenced" in log and topics["releases"] in log and "Traceback" not in log
    got = values_by_key(kafka_bootstrap, topics["releases"])
    assert {day for day, _ in got} == {"2026-01-01", "2026-01-02", "2026-01-03"}
    assert all(len(values) == 1 for values in got.values()), got


@pytest.mark.timeout(300)
def test_a_recreated_releases_topic_gets_its_releases_back_with_their_stored_noise(
    kafka_bootstrap, tmp_path
):
    """The releases topic deleted and created again between two runs: the next start finds it
    behind the state and publishes the releases it lost from their stored payloads (the same
    values: no new noise; the instances run without a test seed)."""
    from tests.support.kafka_broker import admin_client

    topics, events, first, _second = start_two(kafka_bootstrap, tmp_path)
    produce(kafka_bootstrap, topics["events"], of_days(events, {"2026-01-02", "2026-01-03"}))
    cli(RUN_ONCE, cwd=first)
    before = values_by_key(kafka_bootstrap, topics["releases"])
    assert {day for day, _ in before} >= {"2026-01-01", "2026-01-02"}
    admin = admin_client(kafka_bootstrap)
    try:
        admin.delete_topics([topics["releases"]])
        deadline = time.monotonic() + 60
        while topics["releases"] in admin.list_topics():
            assert time.monotonic() < deadline, "the topic was not deleted"
            time.sleep(0.5)
    finally:
        admin.close()
    deadline = time.monotonic() + 60
    while True:  # the broker finishes the deletion before it accepts the name again
        made = cli(["topics", "create", "--config", "streamfilter.toml"], cwd=first, check=False)
        created = [
            line
            for line in made.stdout.splitlines()
            if line.startswith(topics["releases"]) and line.endswith("\tcreated")
        ]
        if made.returncode == 0 and created:
            break
        assert time.monotonic() < deadline, made.stdout + made.stderr
        time.sleep(1)
    proc = cli(RUN_ONCE, cwd=first)
    assert "publishing them again with their stored noise" in proc.stderr
    assert values_by_key(kafka_bootstrap, topics["releases"]) == before


@pytest.mark.timeout(300)
def test_a_deleted_releases_topic_fails_closed_within_seconds(kafka_bootstrap, tmp_path):
    """The releases topic deleted under a running instance: its next publication fails closed
    (exit 4, one line naming the topic) within seconds, not after the 300 s delivery timeout;
    the day's releases stay in the state's outbox."""
    from tests.support.kafka_broker import admin_client

    topics, events, first, _second = start_two(kafka_bootstrap, tmp_path)
    running = spawn(["run", "--config", "streamfilter.toml"], cwd=first)
    try:
        produce(kafka_bootstrap, topics["events"], of_days(events, {"2026-01-02"}))
        wait_for_release(kafka_bootstrap, topics["releases"], ("2026-01-02", "active"), 120)
        admin = admin_client(kafka_bootstrap)
        try:
            admin.delete_topics([topics["releases"]])
            deadline = time.monotonic() + 60
            while topics["releases"] in admin.list_topics():
                assert time.monotonic() < deadline, "the topic was not deleted"
                time.sleep(0.5)
        finally:
            admin.close()
        produce(kafka_bootstrap, topics["events"], [*of_days(events, {"2026-01-03"}), LATE])
        started = time.monotonic()
        code = wait_exit(running, 150)
        elapsed = time.monotonic() - started
    finally:
        if running.poll() is None:
            running.send_signal(9)
    log = running.tail()
    assert code == 4, log
    assert elapsed < 60, (elapsed, log)
    last = log.strip().splitlines()[-1]
    assert "no longer exists" in last and topics["releases"] in last, log
    assert "Traceback" not in log
    db = sqlite3.connect(first / "state.db")
    try:
        unsent = db.execute("SELECT count(*) FROM releases WHERE sent = 0").fetchone()[0]
    finally:
        db.close()
    assert unsent > 0  # the undelivered releases wait in the outbox, with their noise
