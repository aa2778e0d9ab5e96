"""Cluster mode under faults, each on a real Kafka broker, a real PostgreSQL
server and real worker processes: workers SIGKILLed at random moments, PostgreSQL restarted
mid-run, the broker stopped for 30 s.

After each fault the releases are those of the single-process SQLite run of the same events
under the same test seed: every (day, query) published once with one value, none missing, and
every user's debits are the single process's (none above B). The test plays the supervisor
(systemd, Kubernetes): it restarts a worker that exited with a documented code — 4, fail closed
(README, docs/cluster.md) — or that it killed itself, and fails on any other exit.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.runtime.io.test_kafka_daemon import Spawned, make_events
from tests.runtime.test_cluster_worker import (
    Cluster,
    assert_debits_as_reference,
    assert_same_as_reference,
    by_day,
    reference,
    wait_for_log,
)

pytestmark = pytest.mark.kafka

FAIL_CLOSED = 4  # streamfilter.errors.ExitCode.FAIL_CLOSED: the supervisor restarts the worker
RESTART_DELAY_S = 1.0  # a supervisor's pause before a restart (systemd RestartSec)


class Supervisor:
    """Keeps named workers of ``cluster`` running, as a process supervisor would: a worker that
    exited with a code in ``restart_codes`` (or that :meth:`kill` killed) is started again after
    ``RESTART_DELAY_S``; any other exit fails the test."""

    def __init__(self, cluster: Cluster, names: list[str], restart_codes=()) -> None:
        self.cluster = cluster
        self.restart_codes = set(restart_codes)
        self.exits: Counter[int] = Counter()  # exit code -> how many times, killed ones too
        self.procs: dict[str, Spawned] = {}
        self._log_from: dict[str, int] = {}  # where each worker's current run starts in its log
        self._down_since: dict[str, float] = {}
        for name in names:
            self.start(name)

    def start(self, name: str, env: dict[str, str] | None = None) -> None:
        """Start ``name`` (``env``: this run only; a restart runs without it)."""
        log = self.cluster.work / name / "daemon.log"
        self._log_from[name] = log.stat().st_size if log.exists() else 0
        self.procs[name] = self.cluster.worker(name, env=env)

    def log_of(self, name: str) -> str:
        """What the current run of ``name`` logged so far."""
        return self.procs[name].log.read_text(errors="replace")[self._log_from[name] :]

    def releaser(self) -> str | None:
        """The worker whose current run holds the releaser's lock (None: no one yet)."""
        for name, proc in self.procs.items():
            if proc.poll() is None and "this worker is the releaser" in self.log_of(name):
                return name
        return None

    def check(self) -> None:
        """Restart the workers that exited with a restartable code; fail on any other."""
        now = time.monotonic()
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is None:
                continue
            if name not in self._down_since:
                assert code in self.restart_codes, f"{name} exited {code}\n{proc.tail()}"
                self.exits[code] += 1
                self._down_since[name] = now
            if now - self._down_since[name] >= RESTART_DELAY_S:
                del self._down_since[name]
                self.start(name)

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` and start it again at once (a crashed process restarted)."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            self.exits[-signal.SIGKILL] += 1
        self._down_since.pop(name, None)
        self.start(name)

    def wait_for(self, keys: set[tuple[str, str]], timeout: float):
        deadline = time.monotonic() + timeout
        got: dict[tuple[str, str], set[bytes]] = {}
        while time.monotonic() < deadline:
            self.check()
            got = self.cluster.releases()
            if keys <= set(got):
                return got
            time.sleep(1)
        tails = "\n---\n".join(p.tail() for p in self.procs.values())
        raise AssertionError(f"missing {sorted(keys - set(got))[:5]} after {timeout}s\n{tails}")

    def stop(self) -> None:
        """SIGTERM every worker; each drains and exits 0 (one restarted a moment ago may be
        ended by the signal before it set up its handler)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            code = proc.wait(timeout=60)
            starting = code == -signal.SIGTERM and " started" not in self.log_of(name)
            assert code == 0 or starting or name in self._down_since, proc.tail()


def released_through(cluster: Cluster) -> str:
    """The cluster's last released day ("" before the first, or before a worker made the
    ledger)."""
    from psycopg.errors import UndefinedTable

    try:
        rows = cluster.sql("SELECT value FROM {s}.meta WHERE key = 'released_through'")
    except UndefinedTable:
        return ""
    return rows[0][0] if rows else ""


def assert_as_single_process(cluster: Cluster, got, expected, tmp: Path) -> None:
    assert_same_as_reference(got, expected)
    assert_debits_as_reference(cluster, tmp / "reference")
    stored = cluster.sql("SELECT day, query_id FROM {s}.releases")
    assert sorted(stored) == sorted(expected)  # each (day, query) stored once


@pytest.mark.timeout(480)
def test_workers_killed_at_random_moments_change_no_release(
    kafka_bootstrap, postgres_url, tmp_path
):
    """Three workers; the days are produced one by one, and after each a seeded
    ``random.Random`` SIGKILLs a random worker twice at random moments (while that day is read
    and the day before it closes: ingest, day-close commits, the releaser's insert and
    publication; every third kill is the releaser's); the supervisor starts it again at once."""
    rng = random.Random(20261124)
    events = make_events(days=6, users=150, seed=21)
    expected = reference(tmp_path, events)
    cluster = Cluster(tmp_path, kafka_bootstrap, postgres_url)
    days = by_day(events)
    names = ["w0", "w1", "w2"]
    sup = Supervisor(cluster, names)
    moments: list[tuple[str, bool]] = []  # at each kill: the last released day, releaser?
    try:
        wait_for_log(sup.procs["w0"], "cluster worker", 60)
        day_names = sorted({d for d, _ in expected})
        for d, day_events in enumerate(days):
            cluster.produce(day_events)  # ingest of day d, close of day d - 1
            for _ in range(2):
                time.sleep(rng.uniform(0.0, 2.5))
                sup.check()
                # every third kill aims at the releaser (if one holds the lock), the others at
                # anyone
                victim = (len(moments) % 3 == 2 and sup.releaser()) or rng.choice(names)
                moments.append((released_through(cluster), victim == sup.releaser()))
                sup.kill(victim)
            if d >= 1:  # the next day's events arrive once this day's predecessor is out
                wait_until(lambda day=day_names[d - 1]: released_through(cluster) >= day, sup)
        got = sup.wait_for(set(expected), timeout=240)
        time.sleep(3)  # nothing more arrives
        got = cluster.releases()
    finally:
        sup.stop()
    assert sup.exits[-signal.SIGKILL] == 12
    # spread over the run: kills before the first release, and after the fourth day's
    days_at_kills = [day for day, _ in moments]
    assert "" in days_at_kills and max(days_at_kills) >= day_names[3], moments
    assert sum(releaser for _, releaser in moments) >= 3, moments
    assert_as_single_process(cluster, got, expected, tmp_path)


def wait_until(condition, sup: Supervisor, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "\n---\n".join(p.tail() for p in sup.procs.values())
        sup.check()
        time.sleep(0.3)


@pytest.mark.timeout(300)
def test_a_releaser_killed_between_its_insert_and_the_publication(
    kafka_bootstrap, postgres_url, tmp_path
):
    """The releaser (w0, alone at first) SIGKILLs itself right after its transaction stored day
    2's releases, before it published them (crash point ``after_release_insert``); its session
    lock ends with its connection, and the next holder (w1, or w0 restarted) publishes the
    stored releases from the outbox: nobody releases day 2 again (the day was marked released in
    the same transaction)."""
    events = make_events(days=4, users=150, seed=27)
    expected = reference(tmp_path, events)
    cluster = Cluster(tmp_path, kafka_bootstrap, postgres_url)
    cluster.produce(events)
    sup = Supervisor(cluster, [], restart_codes={-signal.SIGKILL})
    sup.start("w0", env={"STREAMFILTER_CRASH_AT": "after_release_insert:2"})
    try:
        proc = sup.procs["w0"]
        assert proc.wait(timeout=120) == -signal.SIGKILL, proc.tail()
        first_run = proc.log.read_text()
        sup.start("w1")  # and the supervisor restarts w0 (without the crash point)
        got = sup.wait_for(set(expected), timeout=180)
        time.sleep(3)  # nothing more arrives
        got = cluster.releases()
    finally:
        sup.stop()
    assert sup.exits == Counter({-signal.SIGKILL: 1})
    assert "this worker is the releaser" in first_run
    assert "released day 2026-01-01" in first_run  # w0 stored day 2, then died
    logs = [(cluster.work / name / "daemon.log").read_text() for name in ("w0", "w1")]
    assert not any("released day 2026-01-02" in log for log in logs)  # nobody released it again
    assert_as_single_process(cluster, got, expected, tmp_path)


@pytest.mark.timeout(480)
def test_postgres_restarted_mid_run(kafka_bootstrap, postgres_private_server, tmp_path):
    """Two workers on a PostgreSQL server of this test's own; after day 2 is released the
    server stops (fast shutdown: every connection is closed) for 5 s and starts again with the
    same data. A worker fails closed at its next ledger call (exit 4: what it buffered and did
    not commit counts for nothing); the supervisor restarts it (while the server is down a
    restarted worker cannot connect and exits 4 again); the restarted workers resume from the
    ledger's positions and finish the run."""
    server = postgres_private_server
    events = make_events(days=6, users=150, seed=23)
    expected = reference(tmp_path, events)
    day_names = sorted({d for d, _ in expected})
    cluster = Cluster(tmp_path, kafka_bootstrap, server.url)
    days = by_day(events)
    cluster.produce([e for day in days[:4] for e in day])
    sup = Supervisor(cluster, ["w0", "w1"], restart_codes={FAIL_CLOSED})
    try:
        wait_until(lambda: released_through(cluster) >= day_names[1], sup)
        server.stop(keep_data=True)
        down = time.monotonic()
        while time.monotonic() - down < 5:
            sup.check()
            time.sleep(0.2)
        server.start(keep_data=True)
        cluster.produce([e for day in days[4:] for e in day])
        got = sup.wait_for(set(expected), timeout=240)
        time.sleep(3)  # nothing more arrives
        got = cluster.releases()
    finally:
        sup.stop()
    assert sup.exits[FAIL_CLOSED] >= 2, sup.exits  # both workers failed closed
    assert set(sup.exits) == {FAIL_CLOSED}
    for name in sup.procs:
        log = (cluster.work / name / "daemon.log").read_text()
        assert "Traceback" not in log  # one line on stderr, no crash
        assert f"state postgres schema {cluster.schema} (last closed day" in log
    assert_as_single_process(cluster, got, expected, tmp_path)


@pytest.mark.timeout(480)
def test_a_broker_outage_of_30s_is_ridden_out_by_the_same_workers(
    kafka_private_broker, postgres_url, tmp_path
):
    """Two workers on a broker of this test's own; after day 1 is released (days 2 and 3 are
    being read and closed) the broker stops for 30 s and starts again with the same data. The
    same worker processes finish the run: no exit, no operator."""
    broker = kafka_private_broker
    events = make_events(days=6, users=150, seed=25)
    expected = reference(tmp_path, events)
    day_names = sorted({d for d, _ in expected})
    # a publication in flight when the broker stopped fails after the producer's delivery
    # timeout and is retried from the outbox: 60 s here instead of the default 300 s (long
    # enough for one sent just before the stop to be delivered once the broker is back)
    cluster = Cluster(tmp_path, broker.bootstrap, postgres_url, delivery_timeout="60s")
    days = by_day(events)
    cluster.produce([e for day in days[:3] for e in day])
    sup = Supervisor(cluster, ["w0", "w1"])  # no exit is expected: none is restarted
    first = dict(sup.procs)
    try:
        wait_until(lambda: released_through(cluster) >= day_names[0], sup)
        broker.stop(keep_data=True)
        down = time.monotonic()
        while time.monotonic() - down < 30:
            sup.check()
            time.sleep(0.5)
        broker.start(keep_data=True)
        cluster.produce([e for day in days[3:] for e in day])
        # within the delivery timeout, the relay's back-off (30 s at most) and the group's
        # re-forming; below the default 300 s, so a timeout the workers ignored would fail here
        got = sup.wait_for(set(expected), timeout=240)
        time.sleep(3)  # nothing more arrives
        got = cluster.releases()
    finally:
        sup.stop()
    assert sup.procs == first and not sup.exits  # the same processes, never restarted
    assert_as_single_process(cluster, got, expected, tmp_path)
