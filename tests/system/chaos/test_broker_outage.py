"""The broker SIGKILLed right after a day committed, back 20 s later; the
same daemon process publishes the day by itself (no restart), one value per (day, query).

Failed before: ``lag()`` timed out on ``end_offsets`` after the commit and the daemon exited 1
with a traceback; the day's releases waited in the outbox until a person restarted it.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
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
from tests.system.chaos.test_partitions_follow import free_port, metric, wait_for_metric

pytestmark = pytest.mark.kafka


@pytest.mark.timeout(420)
def test_the_daemon_publishes_a_committed_day_after_the_broker_returns(
    kafka_private_broker, tmp_path
):
    broker = kafka_private_broker
    bootstrap = broker.bootstrap
    day1 = events(["2026-01-01"], 40)
    expected = reference(tmp_path, day1)
    port = free_port()
    work, topics = kafka_world(
        tmp_path, bootstrap, idle="2s", extra=f"[metrics]\nenabled = true\nport = {port}\n"
    )
    produce(bootstrap, topics["queries"], [json.dumps(QUERY).encode()])
    produce(bootstrap, topics["events"], day1)
    daemon = spawn(
        ["run", "--config", "streamfilter.toml", "--testing"],
        work,
        env={"STREAMFILTER_PAUSE_AT": "after_commit:5"},
    )
    try:
        # the day is committed; the daemon pauses 5 s before its first broker call after it
        wait_for_metric(port, "streamfilter_state_store_commit_seconds_count", 1.0, daemon)
        pid = int((broker.run_dir / "kafka.pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        outage: set[tuple[int, str]] = set()  # /readyz answers seen while the broker is down
        while time.monotonic() - killed < 20:
            assert daemon.poll() is None, daemon.tail()
            outage.add(readyz(port))
            time.sleep(0.5)
        # the committed day waits for the sink: /readyz says so (503 + why), and the gauge too
        assert any(code == 503 and "not acknowledged by the sink" in why for code, why in outage)
        assert metric(port, "streamfilter_ready") == 0.0, outage
        broker.start(keep_data=True)
        deadline = time.monotonic() + 180
        while not (got := _released(bootstrap, topics["releases"])):
            assert daemon.poll() is None, daemon.tail()  # the same process, no restart
            assert time.monotonic() < deadline, daemon.tail()
            time.sleep(1)
        assert got == expected  # one value per (day, query), the committed one
        wait_for_metric(port, "streamfilter_ready", 1.0, daemon)
        assert readyz(port) == (200, "ready")
    finally:
        daemon.proc.terminate()
        daemon.wait(timeout=60)


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status, resp.read().decode().strip()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode().strip()


def _released(bootstrap: str, topic: str) -> list[bytes]:
    try:
        return release_values(bootstrap, topic)
    except (TimeoutError, OSError, Exception):  # the broker may still be electing leaders
        return []


def test_a_transient_sink_error_is_retried_and_reported_by_readyz(tmp_path, monkeypatch):
    """In process: the sink fails twice with a retriable error; the relay backs off, /readyz
    says why meanwhile, and the day is published once the sink heals (no exit)."""
    from prometheus_client import CollectorRegistry

    from streamfilter.engine.monitor import Engine
    from streamfilter.engine.params import PrivacyParams
    from streamfilter.privacy.noise import SeededRandomBits
    from streamfilter.runtime import outbox as outbox_module
    from streamfilter.runtime.daemon import Daemon
    from streamfilter.runtime.observe.prometheus import PrometheusObserver
    from streamfilter.runtime.store import SQLiteStateStore
    from streamfilter.testing import MemorySink, MemorySource
    from tests.runtime.test_daemon import ListFeed

    class Outage(Exception):
        retriable = True

    params = PrivacyParams.create(b_norm=2.0, rho=0.5, granularity=2.0**-8)
    observer = PrometheusObserver(CollectorRegistry(), params)
    readiness: list[tuple[bool, str]] = []

    class FlakySink(MemorySink):
        failures = 2

        def flush(self):
            readiness.append(observer.readiness())
            if self.failures:
                self.failures -= 1
                raise Outage("broker unreachable")
            super().flush()

    monkeypatch.setattr(outbox_module, "RELAY_BACKOFF_S", (0.01, 0.02))
    store = SQLiteStateStore(tmp_path / "state.db")
    sink = FlakySink()
    d = Daemon(
        Engine(params, SeededRandomBits(1)),
        store,
        MemorySource({"p0": events(["2026-01-01"], 5)}),
        ListFeed([QUERY]),
        sink,
        MemorySink(),
        poll_interval_s=0,
        observer=observer,
    )
    d.run(until_end=True)
    store.close()
    assert [json.loads(p)["day"] for p in sink.payloads] == ["2026-01-01"] * 3  # 2 retries
    assert readiness[1][0] is False and "unavailable" in readiness[1][1]
    assert observer.readiness()[0] is False  # stopped after the run; but not for the outage
    assert "unavailable" not in observer.readiness()[1]
