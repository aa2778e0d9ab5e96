"""Cluster mode is operable like one process: every worker serves its configured
``/metrics``, ``/healthz`` and ``/readyz`` (the port was ignored in cluster mode before), and
the partitions the workers own add up to the topic's, which the ``StreamfilterPartitionsUnowned``
alert compares (deploy/prometheus/alerts.yml)."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest

from tests.runtime.io.test_kafka_daemon import make_events
from tests.runtime.test_cluster_worker import PARTITIONS, Cluster, reference, stop_all

pytestmark = pytest.mark.kafka


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        line.split(" ")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("streamfilter_") and "{" not in line.split(" ")[0]
    }


@pytest.mark.timeout(300)
def test_every_worker_serves_metrics_and_owned_partitions_add_up(
    kafka_bootstrap, postgres_url, tmp_path
):
    events = make_events(days=2, users=120, seed=3)
    expected = reference(tmp_path, events)
    cluster = Cluster(tmp_path, kafka_bootstrap, postgres_url)
    cluster.produce(events)
    ports = [_free_port(), _free_port()]
    procs = [
        cluster.worker(
            f"w{i}",
            env={"STREAMFILTER_METRICS__ENABLED": "true", "STREAMFILTER_METRICS__PORT": str(port)},
        )
        for i, port in enumerate(ports)
    ]
    try:
        cluster.wait_for(set(expected), procs, timeout=200)
        deadline = time.monotonic() + 60
        while True:  # both in the group: each owns some, together all
            scrapes = [_scrape(port) for port in ports]
            owned = [s.get("streamfilter_cluster_partitions_owned", 0.0) for s in scrapes]
            if sum(owned) == PARTITIONS and all(owned):
                break
            assert time.monotonic() < deadline, owned
            time.sleep(1)
        for port, s in zip(ports, scrapes, strict=True):
            assert s["streamfilter_source_partitions"] == PARTITIONS
            assert s["streamfilter_ready"] == 1.0
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
                assert resp.status == 200
        # the releaser exported the releases it made; the other worker made none
        assert sum(s.get("streamfilter_day_closes_total", 0.0) for s in scrapes) == 2
    finally:
        stop_all(procs)
