"""Partitions added to the events topic while the daemon runs are read
from their beginning, and every open day waits for them; a log line says so.

Failed before: the daemon kept reading the partitions it had when it started; the day the new
partitions' events belonged to closed without them (released as noise around 0).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from tests.runtime.io.test_kafka_daemon import spawn
from tests.system.chaos.harness import (
    QUERY,
    events,
    kafka_world,
    produce,
    reference,
    release_values,
)

pytestmark = pytest.mark.kafka


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metric(port: int, name: str) -> float | None:
    """One sample of the daemon's /metrics (``name`` with its labels), or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for_metric(port: int, name: str, value: float, daemon, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while metric(port, name) != value:
        assert daemon.poll() is None, daemon.tail()
        assert time.monotonic() < deadline, daemon.tail()
        time.sleep(0.3)


def grow(bootstrap: str, topic: str, partitions: int) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewPartitions

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_partitions({topic: NewPartitions(partitions)})
    finally:
        admin.close()


@pytest.mark.timeout(240)
def test_partitions_added_while_running_are_read_and_hold_their_days(kafka_bootstrap, tmp_path):
    first = events(["2026-01-01"], 50)
    added = events(["2026-01-01"], 300, seed=1, prefix="n")
    second = events(["2026-01-02"], 30, seed=2)
    expected = reference(tmp_path, [*first, *added, *second])
    port = free_port()
    work, topics = kafka_world(
        tmp_path, kafka_bootstrap, idle="12s", extra=f"[metrics]\nenabled = true\nport = {port}\n"
    )
    produce(kafka_bootstrap, topics["queries"], [json.dumps(QUERY).encode()])
    produce(kafka_bootstrap, topics["events"], first, partition=0)
    daemon = spawn(["run", "--config", "streamfilter.toml", "--testing"], work)
    try:
        # the daemon has read the one partition it started with (its day waits 12 s of idleness)
        wait_for_metric(
            port,
            f'streamfilter_records_consumed_total{{partition="{topics["events"]}:0"}}',
            50.0,
            daemon,
        )
        assert metric(port, "streamfilter_source_partitions") == 1.0
        grow(kafka_bootstrap, topics["events"], 3)
        produce(kafka_bootstrap, topics["events"], added[:150], partition=1)
        produce(kafka_bootstrap, topics["events"], added[150:], partition=2)
        for p in range(3):
            produce(kafka_bootstrap, topics["events"], second[p * 10 : p * 10 + 10], partition=p)
        deadline = time.monotonic() + 90
        while len(got := release_values(kafka_bootstrap, topics["releases"])) < 2:
            assert daemon.poll() is None, daemon.tail()
            assert time.monotonic() < deadline, daemon.tail()
            time.sleep(1)
        assert got == expected  # all 380 events counted, byte-identical releases
        assert "grew to 3 partitions" in daemon.tail()
        assert metric(port, "streamfilter_source_partitions") == 3.0
        assert metric(port, "streamfilter_source_partitions_added_total") == 2.0
    finally:
        daemon.proc.terminate()
        daemon.wait(timeout=60)
