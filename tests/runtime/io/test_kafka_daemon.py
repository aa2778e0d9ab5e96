"""The daemon on a real Apache Kafka broker: end to end, crashes, outage, SIGTERM.

Every test compares against a reference run of the same events through the file path under the
same test seed (noise is seeded per (day, query), so an interrupted run must reproduce the
uninterrupted releases byte for byte; that also proves no valid event was lost or counted twice).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support.cli import stored_budgets
from tests.support.kafka_broker import read_topic, unique_topic

pytestmark = pytest.mark.kafka

QUERIES = [
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
        "from_day": "2026-01-02",
    },
    {
        "query_id": "mix",
        "kind": "linear",
        "weights": {"active": [1, 0], "minutes": [0, 0.01]},
        "clip": 2.0,
        "from_day": "2026-01-01",
    },
]
B_NORM = 3.0
GAMMA = 2.0**-10


def make_events(days: int, users: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for d in range(days):
        day = f"2026-01-{d + 1:02d}"
        for u in range(users):
            if rng.random() < 0.4:
                plan = ["free", "pro", "team"][u % 3]
                out.append(
                    json.dumps(
                        {
                            "user_id": f"u-{u}",
                            "day": day,
                            "values": {"active": 1, "minutes": rng.randint(0, 90), "plan": plan},
                            "event_id": f"e{d}-{u}",
                        }
                    ).encode()
                )
        if d % 3 == 1:
            out.append(b"{not json")  # a reject on the way
    return out


def config_text(mode: str, topics: dict[str, str] | None = None, bootstrap: str = "") -> str:
    head = f"""
[privacy]
b_norm = {B_NORM}
rho = 0.5
granularity = {GAMMA}
[testing]
noise_seed = 5
[state]
path = "state.db"
[window]
allowed_lateness = "0s"
idle_timeout = "3s"
poll_interval = "0.2s"
"""
    if mode == "file":
        return (
            head
            + """
[source]
kind = "file"
path = "events.jsonl"
[queries]
kind = "file"
path = "queries.jsonl"
[sink]
kind = "file"
path = "releases.jsonl"
"""
        )
    assert topics is not None
    return (
        head
        + f"""
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "sf-{topics["events"]}"
[source]
kind = "kafka"
topic = "{topics["events"]}"
partitions = 3
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
    )


def cli(args, cwd, env=None, check=True, timeout=180):
    proc = subprocess.run(
        [sys.executable, "-m", "streamfilter", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


class Spawned:
    """A daemon process whose stderr goes to ``daemon.log`` in its working directory."""

    def __init__(self, args, cwd, env=None):
        self.log = Path(cwd) / "daemon.log"
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamfilter", *args],
                cwd=cwd,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, **(env or {})},
            )

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def poll(self):
        return self.proc.poll()

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        return self.proc.wait(timeout=timeout)


def spawn(args, cwd, env=None) -> Spawned:
    return Spawned(args, cwd, env)


def reference(tmp: Path, events: list[bytes]) -> dict[tuple[str, str], bytes]:
    ref = tmp / "reference"
    ref.mkdir()
    (ref / "streamfilter.toml").write_text(config_text("file"))
    (ref / "events.jsonl").write_bytes(b"\n".join(events) + b"\n")
    (ref / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    cli(["run", "--config", "streamfilter.toml", "--until-end", "--testing"], cwd=ref)
    out = {}
    for line in (ref / "releases.jsonl").read_bytes().splitlines():
        obj = json.loads(line)
        out[(obj["day"], obj["query_id"])] = line
    return out


def setup_kafka(tmp: Path, bootstrap: str, events: list[bytes]) -> tuple[Path, dict[str, str]]:
    from kafka import KafkaProducer

    work = tmp / "kafka"
    work.mkdir()
    topics = {k: unique_topic(k) for k in ("events", "queries", "releases", "rejects")}
    (work / "streamfilter.toml").write_text(config_text("kafka", topics, bootstrap))
    created = cli(["topics", "create", "--config", "streamfilter.toml"], cwd=work)
    assert created.stdout.count("created") == 4
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for q in QUERIES:
        producer.send(topics["queries"], value=json.dumps(q).encode())
    for ev in events:
        try:
            key = json.loads(ev)["user_id"].encode()
        except ValueError:
            key = b"garbage"
        producer.send(topics["events"], key=key, value=ev)
    producer.flush()
    producer.close()
    return work, topics


def released(bootstrap: str, topic: str) -> dict[tuple[str, str], set[bytes]]:
    by_key: dict[tuple[str, str], set[bytes]] = defaultdict(set)
    for rec in read_topic(bootstrap, topic, timeout=60):
        obj = json.loads(rec.value)
        assert rec.key.decode() == f"{obj['day']}/{obj['query_id']}"
        by_key[(obj["day"], obj["query_id"])].add(rec.value)
    return by_key


def assert_budgets_within(work: Path) -> None:
    """Users were charged, and nobody beyond the budget (log and table, as the store loads them)."""
    budget_units = int(B_NORM / GAMMA**2)
    budgets = stored_budgets(work / "state.db")
    assert budgets and max(spent for _, spent, _ in budgets) <= budget_units


@pytest.mark.timeout(300)
def test_until_end_on_kafka_matches_the_file_path(kafka_bootstrap, tmp_path):
    events = make_events(days=6, users=300)
    expected = reference(tmp_path, events)
    work, topics = setup_kafka(tmp_path, kafka_bootstrap, events)
    cli(["run", "--config", "streamfilter.toml", "--until-end", "--testing"], cwd=work)
    got = released(kafka_bootstrap, topics["releases"])
    assert set(got) == set(expected)
    for key, values in got.items():
        assert values == {expected[key]}, key
    rejects = [json.loads(r.value) for r in read_topic(kafka_bootstrap, topics["rejects"])]
    assert [r["reason"] for r in rejects] == ["malformed_json"] * 2


@pytest.mark.timeout(120)
def test_missing_topic_is_named(kafka_bootstrap, tmp_path):
    topics = {k: unique_topic(k) for k in ("events", "queries", "releases", "rejects")}
    (tmp_path / "streamfilter.toml").write_text(config_text("kafka", topics, kafka_bootstrap))
    proc = cli(
        ["run", "--config", "streamfilter.toml", "--until-end", "--testing"],
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2
    assert topics["events"] in proc.stderr and "source.topic" in proc.stderr
    assert "topics create" in proc.stderr


SENTINEL_DAY = "2026-03-01"


def sentinel_events(users: int = 60) -> list[bytes]:
    """Events of a much later day: every partition moves past the real days, which then close."""
    return [
        json.dumps({"user_id": f"u-{u}", "day": SENTINEL_DAY, "values": {"active": 1}}).encode()
        for u in range(users)
    ]


def wait_for_release(
    bootstrap: str, topic: str, key: tuple[str, str], timeout: float, on_tick=None
):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if on_tick is not None:
            on_tick()
        got = released(bootstrap, topic)
        if key in got:
            return got
        time.sleep(1)
    raise AssertionError(f"release {key} did not appear within {timeout}s")


def assert_matches_reference(got, expected, last_day):
    real = {k: v for k, v in got.items() if k[0] <= last_day}
    want = {k: v for k, v in expected.items() if k[0] <= last_day}
    assert set(real) == set(want), "a (day, query) is missing or unexpected"
    for key, values in real.items():
        assert values == {want[key]}, f"{key}: {len(values)} distinct values"


@pytest.mark.timeout(600)
def test_sigkill_at_random_moments_and_crash_points(kafka_bootstrap, tmp_path):
    """Follow mode over a multi-day stream: three deterministic crash points, then SIGKILL at
    >= 10 random moments, restarting each time; then SIGTERM drains and exits 0."""
    events = make_events(days=12, users=3000, seed=3)
    expected = reference(tmp_path, events)
    last_day = max(k[0] for k in expected)
    work, topics = setup_kafka(tmp_path, kafka_bootstrap, events + sentinel_events())
    args = ["run", "--config", "streamfilter.toml", "--testing"]
    for point in ("after_commit:2", "after_publish:3", "before_mark_sent:4"):
        proc = cli(args, cwd=work, env={"STREAMFILTER_CRASH_AT": point}, check=False, timeout=120)
        assert proc.returncode == -signal.SIGKILL, (point, proc.stderr[-2000:])
    rng = random.Random(11)
    for _ in range(10):
        proc = spawn(args, cwd=work)
        time.sleep(rng.uniform(0.5, 2.5))
        assert proc.poll() is None, proc.tail()  # follow mode never exits alone
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    proc = spawn(args, cwd=work)
    try:
        got = wait_for_release(kafka_bootstrap, topics["releases"], (last_day, "active"), 120)
        time.sleep(
            3
        )  # the last daemon is up (past interpreter start-up) before it is asked to stop
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert_matches_reference(got, expected, last_day)
    assert_budgets_within(work)


@pytest.mark.timeout(400)
def test_broker_outage_then_sigterm_drains(kafka_private_broker, tmp_path):
    """Follow mode: the broker stops for 30 s mid-run; the daemon survives (or is restarted by
    this test acting as supervisor), resumes, loses and duplicates nothing; SIGTERM exits 0."""
    from kafka import KafkaProducer

    bootstrap = kafka_private_broker.bootstrap
    events = make_events(days=8, users=400, seed=5)
    by_day: dict[str, list[bytes]] = defaultdict(list)
    for ev in events:
        try:
            by_day[json.loads(ev)["day"]].append(ev)
        except ValueError:
            by_day["bad"].append(ev)
    expected = reference(tmp_path, events)
    work, topics = setup_kafka(tmp_path, bootstrap, [])
    args = ["run", "--config", "streamfilter.toml", "--testing"]  # follow mode
    restarts = 0
    proc = spawn(args, cwd=work)

    def supervise():
        nonlocal proc, restarts
        if proc.poll() is not None:
            restarts += 1
            proc = spawn(args, cwd=work)

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        retries=50,
        delivery_timeout_ms=120_000,
        request_timeout_ms=10_000,
    )
    days = sorted(d for d in by_day if d != "bad")
    for i, day in enumerate(days):
        for ev in by_day[day]:
            producer.send(topics["events"], key=json.loads(ev)["user_id"].encode(), value=ev)
        producer.flush()
        time.sleep(1.0)
        supervise()
        if i == len(days) // 2:
            kafka_private_broker.stop(keep_data=True)
            time.sleep(30)
            kafka_private_broker.start(keep_data=True)
            supervise()
    for ev in sentinel_events():
        producer.send(topics["events"], key=json.loads(ev)["user_id"].encode(), value=ev)
    producer.flush()
    producer.close()
    last_day = days[-1]
    got = wait_for_release(
        bootstrap, topics["releases"], (last_day, "active"), 120, on_tick=supervise
    )
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert time.monotonic() - started < 30
    got = released(bootstrap, topics["releases"])
    assert_matches_reference(got, expected, last_day)
    assert_budgets_within(work)


def test_the_producers_use_the_configured_delivery_timeout(kafka_bootstrap, tmp_path):
    """``[kafka] delivery_timeout`` reaches both Kafka producers (releases, rejects); the
    default is 300 s."""
    from streamfilter.config import load_config
    from streamfilter.runtime.app import build_daemon

    work, topics = setup_kafka(tmp_path, kafka_bootstrap, [])
    config = work / "streamfilter.toml"
    for text, want_ms in (("", 300_000), ('delivery_timeout = "45s"\n', 45_000)):
        kafka = "[kafka]\n" + text
        config.write_text(config_text("kafka", topics, kafka_bootstrap).replace("[kafka]\n", kafka))
        parts = build_daemon(load_config(config), follow=False, allow_test_seed=True)
        try:
            for sink in (parts.sink, parts.reject_sink):
                assert sink._producer.config["delivery_timeout_ms"] == want_ms
        finally:
            parts.close()


@pytest.mark.timeout(300)
def test_a_restored_stale_state_is_refused_by_the_release_topic(kafka_bootstrap, tmp_path):
    """The whole state (database and its .seq mirror) put back to an older copy: only the
    release topic still knows later days were published — the daemon must refuse to start."""
    from kafka import KafkaProducer

    events = make_events(days=6, users=100)

    def day_of(ev: bytes) -> str:
        try:
            return json.loads(ev)["day"]
        except ValueError:
            return ""  # the malformed lines go with the first half

    early = [e for e in events if day_of(e) <= "2026-01-03"]
    late = [e for e in events if e not in early]
    work, topics = setup_kafka(tmp_path, kafka_bootstrap, early)
    cli(["run", "--config", "streamfilter.toml", "--until-end", "--testing"], cwd=work)
    snapshot = {n: (work / n).read_bytes() for n in ("state.db", "state.db.seq")}
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    for ev in late:
        producer.send(topics["events"], value=ev)
    producer.flush()
    producer.close()
    cli(["run", "--config", "streamfilter.toml", "--until-end", "--testing"], cwd=work)
    before = released(kafka_bootstrap, topics["releases"])
    assert max(day for day, _ in before) == "2026-01-06"
    for name, data in snapshot.items():
        (work / name).write_bytes(data)
    for extra in ("state.db-wal", "state.db-shm"):
        (work / extra).unlink(missing_ok=True)
    proc = cli(
        ["run", "--config", "streamfilter.toml", "--until-end", "--testing"], cwd=work, check=False
    )
    assert proc.returncode == 4, proc.stderr
    assert "stale" in proc.stderr and "2026-01-06" in proc.stderr
    assert released(kafka_bootstrap, topics["releases"]) == before  # nothing re-drawn


@pytest.mark.timeout(120)
def test_kafka_source_batches_are_its_records_as_columns(kafka_bootstrap):
    """``KafkaSource.poll_batches``: per partition, in partition order, the records' offsets and
    values (a tombstone, i.e. a null value, is an empty record); ``poll`` is the same records one
    by one; seeking to stored offsets resumes there."""
    from kafka import KafkaProducer

    from streamfilter.runtime.io.kafka import KafkaSource
    from tests.support.kafka_broker import create_topic

    topic = create_topic(kafka_bootstrap, unique_topic("batches"), partitions=3)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    sent: dict[int, list[bytes]] = defaultdict(list)
    for i in range(60):
        value = None if i == 7 else f"v{i}".encode()
        meta = producer.send(topic, key=b"k", value=value, partition=i % 3).get(timeout=30)
        sent[meta.partition].append(value or b"")
    producer.close()

    def read_all(source, poll, n=60):
        got: dict[str, list] = defaultdict(list)
        deadline = time.monotonic() + 30
        while sum(map(len, got.values())) < n and time.monotonic() < deadline:
            for item in poll(source):
                got[item[0]].append(item[1:])
        return got

    client = {"bootstrap_servers": kafka_bootstrap}
    batched = KafkaSource(topic, client, unique_topic("g"), poll_timeout_ms=200)
    batched.seek({})

    def batches(source):
        out = source.poll_batches(25)
        labels = [b.partition for b in out]
        assert labels == sorted(labels, key=lambda s: int(s.rsplit(":", 1)[1]))
        for b in out:
            assert len(b.offsets) == len(b.values) and b.next_offset == b.offsets[-1] + 1
        return [(b.partition, o, v) for b in out for o, v in zip(b.offsets, b.values, strict=True)]

    got = read_all(batched, batches)
    assert {p: [v for _, v in rows] for p, rows in got.items()} == {
        f"{topic}:{p}": values for p, values in sent.items()
    }
    assert all([o for o, _ in rows] == list(range(20)) for rows in got.values())
    batched.close()

    plain = KafkaSource(topic, client, unique_topic("g"), poll_timeout_ms=200)
    plain.seek({f"{topic}:0": 5})
    got_plain = read_all(
        plain, lambda s: [(r.partition, r.offset, r.value) for r in s.poll(25)], n=55
    )
    plain.close()
    assert got_plain[f"{topic}:0"] == got[f"{topic}:0"][5:]
    assert got_plain[f"{topic}:1"] == got[f"{topic}:1"]
