"""``kafka_vs_bare_consumer``: daemon throughput on Kafka ÷ a bare kafka-python consumer loop.

A single-node broker is started like the tests start it (``tests/support/kafka_broker.py``: KRaft, free
ports, ``deploy/kafka/kafka-up.sh``) unless ``KAFKA_BOOTSTRAP`` names one. One events topic with
3 partitions is filled with ``n`` events over 5 days (``n/5`` users a day), then ``runs`` pairs,
each measured back to back (alternating which goes first):

* baseline: a bare ``KafkaConsumer`` assigned to all partitions, polling until the end offsets
  and decoding nothing — the ceiling of any kafka-python consumer on this topic;
* streamfilter: the real daemon (``build_daemon`` + ``run(until_end=True)``) on the same topic:
  batch validation, accumulation, 5 day closes with 3 standing queries, SQLite commits, releases
  published to a Kafka topic with ``acks=all``.

Both are timed in-process, start-up excluded (clients, assignment, seeks; for the daemon also the
stale-state check's one read of its releases topic). The daemon runs under its own collector
policy (:func:`~streamfilter.runtime.daemon.collector_for_run`), interpreter tuning a plain loop
would profit from too, so the headline runs the bare loop under the same policy: ratio = median
over the pairs of (daemon events/s ÷ bare events/s, both under the daemon's collector policy);
target ≥ 0.8. The detail also gives the same ratio in CPU seconds of this process (less
sensitive to other load on a shared machine).

Two more arms in every pair (four arms, their order reversed every other pair):

* ``ratio_default_gc``: the bare loop under the interpreter's default collector — the daemon's
  tuning in its arm only, so *not* like for like; reported beside the headline;
* ``ratio_fold_early``: the daemon with ``[state] budget_log_max_rows = 0``, which folds the
  budget log into the budgets table whenever it outgrows the table (day 1, then every second
  day here) — with the default (10⁶ rows) these 5 days of 60k users never fold, and a fold's
  upserts are paid later, once per user. ``--quick``: the entry
is skipped when no broker can be started (no java / jars); ``make bench`` needs one.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from benchmarks.common import entry, skipped
from streamfilter.policies import standing_monitoring
from streamfilter.runtime.process import collector_for_run
from streamfilter.runtime.store import BUDGET_LOG_MAX_ROWS

NAME = "kafka_vs_bare_consumer"
BASELINE = "bare kafka-python consumer loop, same topic (3 partitions), same collector policy"
TARGET = 0.8


class BrokerUnavailable(RuntimeError):
    pass


@contextmanager
def broker() -> Iterator[str]:
    """``KAFKA_BOOTSTRAP``, or a broker started (and stopped) here the way the tests do."""
    external = os.environ.get("KAFKA_BOOTSTRAP", "").strip()
    if external:
        yield external
        return
    from tests.support.kafka_broker import (
        KafkaBroker,
        KafkaBrokerError,
        KafkaUnavailable,
        free_port_pair,
    )

    for _ in range(3):  # retry if another process took the ports meanwhile
        b = KafkaBroker(*free_port_pair())
        try:
            b.start()
            break
        except KafkaUnavailable as exc:
            b.stop(purge=True)
            raise BrokerUnavailable(str(exc).strip().splitlines()[-1]) from None
        except KafkaBrokerError as exc:
            if "in use" not in str(exc):
                raise
    else:
        raise BrokerUnavailable("no free ports for a broker")
    try:
        yield b.bootstrap
    finally:
        b.stop(purge=True)


def fill_topic(
    bootstrap: str, topic: str, n: int, days: int, partitions: int = 3, users: int | None = None
) -> int:
    """``n`` events over ``days`` days keyed by user (every user active every day; ``users`` a
    day, by default one event each) in a new topic of ``partitions``; returns the users a day."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=256_000)
    per_day = n // days
    users = users or per_day
    for i in range(n):
        day = f"2026-01-{1 + min(i // per_day, days - 1):02d}"
        user = f"u-{i % (min(users, per_day) or 1)}"
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
    return min(users, per_day)


def _bare_consumer(bootstrap: str, topic: str, same_gc: bool = False) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, records) of reading the whole topic; ``same_gc``: under the
    daemon's collector policy."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    end = consumer.end_offsets(tps)
    count = 0
    with collector_for_run() if same_gc else contextlib.nullcontext():
        t0, c0 = time.perf_counter(), time.process_time()
        while any(consumer.position(tp) < end[tp] for tp in tps):
            for batch in consumer.poll(timeout_ms=500, max_records=50_000).values():
                count += len(batch)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    consumer.close()
    return elapsed, cpu, count


def _daemon(
    bootstrap: str,
    topic: str,
    releases: str,
    queries_file: Path,
    work: Path,
    fold_early: bool = False,
) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, records read) of a daemon run over the whole topic;
    ``fold_early``: with ``budget_log_max_rows = 0``."""
    state = work / (uuid.uuid4().hex + ".db")
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
path = "{state}"
budget_log_max_rows = {0 if fold_early else BUDGET_LOG_MAX_ROWS}
"""
    )
    parts = build_daemon(load_config(cfg), follow=False)
    # start-up, excluded like the bare consumer's: the stale-state check reads the releases
    # topic, takes it over and reads it again once per process (the sink remembers the answer)
    parts.sink.last_published_day()
    parts.sink.take_over()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        summary = parts.daemon.run(until_end=True)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        parts.close()
    assert summary.days_closed == 5 and summary.releases_published == 15, summary.as_dict()
    with contextlib.closing(sqlite3.connect(state)) as db:  # the log was folded, or not
        folded = db.execute("SELECT count(*) FROM budgets").fetchone()[0]
    assert (folded > 0) == fold_early, folded
    return elapsed, cpu, summary.records_read


# the example policy's three standing queries (active, plans, hours); from_day set per run
QUERIES = standing_monitoring([], "2026-01-01")


def run(quick: bool = False) -> list[dict[str, object]]:
    n = 10_000 if quick else 300_000
    runs = 3 if quick else 5
    try:
        with broker() as bootstrap:
            return [_measure(bootstrap, n, runs)]
    except BrokerUnavailable as exc:
        if quick:
            return [skipped(NAME, "events/s", BASELINE, f"no Kafka broker ({exc})")]
        raise


def _measure(bootstrap: str, n: int, runs: int) -> dict[str, object]:
    topic = f"bench-events-{uuid.uuid4().hex[:8]}"
    fill_topic(bootstrap, topic, n, days=5)
    # each daemon run is a new run (fresh state): it gets its own releases topic, or the
    # stale-state check would refuse it (the topic would already hold later days)
    releases = [f"bench-releases-{uuid.uuid4().hex[:8]}" for _ in range(2 * runs)]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(name, 1, 1) for name in releases])
    admin.close()
    bare, daemon, wall_ratio, cpu_ratio, default_gc, fold_early = [], [], [], [], [], []
    bare_per_cpu, daemon_per_cpu = [], []  # events per CPU second of the process (per core)
    arms = ("bare", "daemon", "bare_same_gc", "daemon_fold_early")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        queries = work / "queries.jsonl"
        queries.write_text(
            "".join(json.dumps({**q, "from_day": "2026-01-01"}) + "\n" for q in QUERIES)
        )
        for i in range(runs):
            pair = {}
            for who in arms if i % 2 == 0 else arms[::-1]:
                if who.startswith("bare"):
                    pair[who] = _bare_consumer(bootstrap, topic, same_gc=who != "bare")
                else:
                    fold = who != "daemon"
                    pair[who] = _daemon(
                        bootstrap, topic, releases[2 * i + fold], queries, work, fold
                    )
                assert pair[who][2] == n, (who, pair[who])
            (bw, bc, _), (dw, dc, _) = pair["bare_same_gc"], pair["daemon"]
            bare.append(n / bw)
            daemon.append(n / dw)
            wall_ratio.append(bw / dw)
            cpu_ratio.append(bc / dc)
            bare_per_cpu.append(n / bc)
            daemon_per_cpu.append(n / dc)
            default_gc.append(pair["bare"][0] / dw)
            fold_early.append(bw / pair["daemon_fold_early"][0])
    ratio = statistics.median(wall_ratio)
    crc = _crc_implementation()
    return entry(
        NAME,
        value=round(statistics.median(daemon)),
        unit="events/s",
        baseline=BASELINE,
        baseline_value=round(statistics.median(bare)),
        ratio=round(ratio, 3),
        ratio_definition=(
            "median of daemon ÷ bare events/s, paired runs, both under the daemon's collector"
        ),
        target=f"≥ {TARGET}",
        target_met=ratio >= TARGET,
        runs=runs,
        size=f"{n:,} events, 3 partitions, 5 days",
        detail=(
            f"{n:,} events ({n // 5:,} users a day) in 3 partitions, 5 day closes with 3 standing "
            f"queries, SQLite commits, releases to Kafka with acks=all; wall-clock ratios "
            f"{', '.join(f'{r:.2f}' for r in wall_ratio)}; the same ratio in CPU seconds of "
            f"this process: {statistics.median(cpu_ratio):.2f} (median); per core (events per "
            f"CPU second of the process, median): daemon "
            f"{statistics.median(daemon_per_cpu):,.0f}, bare {statistics.median(bare_per_cpu):,.0f}"
            f"; CRC-32C in both arms: "
            f"{crc}; not like for like, the bare loop under the interpreter's default "
            f"collector (the daemon's tuning in its arm only): "
            f"{statistics.median(default_gc):.3f} "
            f"({', '.join(f'{r:.2f}' for r in default_gc)}); the daemon folding its budget log "
            f"whenever it outgrows the table (budget_log_max_rows = 0): "
            f"{statistics.median(fold_early):.3f} ({', '.join(f'{r:.2f}' for r in fold_early)})"
        ),
        cpu_ratio=round(statistics.median(cpu_ratio), 3),
        events_per_cpu_second=round(statistics.median(daemon_per_cpu)),
        baseline_events_per_cpu_second=round(statistics.median(bare_per_cpu)),
        #: both arms run in this process, so they check record batches with the same CRC-32C
        crc32c=crc,
        ratio_default_gc=round(statistics.median(default_gc), 3),
        ratio_fold_early=round(statistics.median(fold_early), 3),
    )


def _crc_implementation() -> str:
    """Which CRC-32C kafka-python checks fetched batches with (both arms share it)."""
    from kafka.record import util

    impl = util._crc32c
    module = impl.__module__ or ""
    kind = "C, package crc32c" if module.split(".")[0] == "crc32c" else "pure Python"
    return f"{module}.{impl.__name__} ({kind})"


if __name__ == "__main__":
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
