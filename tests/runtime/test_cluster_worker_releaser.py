"""The cluster's releaser under faults (docs/design.md §7.3, docs/cluster.md "What happens
when…"), on a real Kafka broker, a real PostgreSQL server and real worker processes:

* a releaser that stops (SIGSTOP) or dies (SIGKILL) in the middle of a publication is replaced
  as soon as the group's coordinator ends its membership (``session_timeout``), long before its
  30 s lease expires; the stopped one, continued, is fenced and steps down;
* a worker started on a stale copy of the ledger refuses the releases topic before it fences
  the healthy releaser, which keeps publishing;
* a releases topic deleted under the cluster fails it closed with one line and no exit; once the
  topic exists again, the releases it lost are published again with their stored noise.

While workers run, each test produces events in one batch at most: a worker may close a day
for an idle partition whose newest records it has not polled yet when another worker has
already read that day elsewhere (its end offsets are cached for a second), and those records
are then late. That race belongs to the day-close rule, not to the releaser; every extra batch
would be one more chance of it.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

import pytest

from tests.runtime.io.test_kafka_daemon import make_events, released
from tests.runtime.test_cluster_worker import (
    Cluster,
    assert_debits_as_reference,
    assert_same_as_reference,
    by_day,
    reference,
    stop_all,
    wait_for_log,
)
from tests.support.kafka_broker import admin_client, read_topic

pytestmark = pytest.mark.kafka

LEASE = 'releaser_lease = "6s"'


def with_lease(cluster: Cluster, lease_s: int) -> None:
    config = cluster.work / "cluster.toml"
    text = config.read_text()
    assert LEASE in text
    config.write_text(text.replace(LEASE, f'releaser_lease = "{lease_s}s"'))


def records_per_key(cluster: Cluster) -> Counter[tuple[str, str]]:
    """How many committed records each (day, query) has on the releases topic."""
    out: Counter[tuple[str, str]] = Counter()
    for rec in read_topic(cluster.bootstrap, cluster.topics["releases"], timeout=60):
        obj = json.loads(rec.value)
        out[(obj["day"], obj["query_id"])] += 1
    return out


def wait_until(condition, procs, timeout: float, poll_s: float = 0.25) -> float:
    """Seconds until ``condition()`` held (the processes in ``procs`` must keep running)."""
    started = time.monotonic()
    while not condition():
        for proc in procs:
            assert proc.poll() is None, proc.tail()
        assert time.monotonic() - started < timeout, "\n---\n".join(p.tail() for p in procs)
        time.sleep(poll_s)
    return time.monotonic() - started


def all_sent(cluster: Cluster) -> bool:
    rows = cluster.sql("SELECT count(*), count(*) FILTER (WHERE sent) FROM {s}.releases")
    return rows[0][0] > 0 and rows[0][0] == rows[0][1]


#: the stall the hand-over must stay under: the 30 s lease is what it was before
STALL_BOUND_S = 20.0


@pytest.mark.timeout(480)
@pytest.mark.parametrize("fault", ["SIGSTOP", "SIGKILL"])
def test_the_releaser_is_replaced_within_seconds_once_it_left_the_group(
    fault, kafka_bootstrap, postgres_url, tmp_path
):
    """Three workers, a 30 s releaser lease, a 6 s group session. The releaser (a, the first
    to start) stops or dies right after it sent day 1's releases in a Kafka transaction it has
    not committed (crash point ``after_publish``). The coordinator ends its membership after
    the session timeout; b or c sees a stable group without it and takes the lease at once:
    its producer fences a's (the open transaction is aborted) and it publishes day 1 from the
    ledger's outbox. The stall, from the signal to day 1 on the topic, must stay well under the
    lease. A stopped a, continued, finds its producer fenced and its lease gone: it steps down
    and goes on as a worker. Every (day, query) is on the topic once, with the single
    process's bytes."""
    events = make_events(days=4, users=240, seed=31)
    expected = reference(tmp_path, events)
    cluster = Cluster(tmp_path, kafka_bootstrap, postgres_url)
    with_lease(cluster, 30)
    a = cluster.worker("a", env={"STREAMFILTER_PAUSE_AT": "after_publish:25"})
    procs = [a]
    try:
        wait_for_log(a, "this worker is the releaser", 60)
        procs += [cluster.worker("b"), cluster.worker("c")]
        for proc in procs:
            wait_for_log(proc, "assigned partition", 120)
        cluster.produce(events)  # one batch (module doc)
        wait_for_log(a, "pausing 25s at crash point after_publish", 120)
        a.send_signal(getattr(signal, fault))
        day1 = {key for key in expected if key[0] == "2026-01-01"}
        stall = wait_until(lambda: day1 <= set(cluster.releases()), procs[1:], 120)
        print(f"\nreleaser {fault}: day 1 published {stall:.1f} s after the signal")
        if fault == "SIGSTOP":
            a.send_signal(signal.SIGCONT)
            wait_for_log(a, "stepping down as the releaser", 60)
        else:
            assert a.proc.wait(timeout=30) == -signal.SIGKILL
            procs.remove(a)
        cluster.wait_for(set(expected), procs, timeout=180)
        time.sleep(2)  # nothing more arrives
        got = cluster.releases()
        counts = records_per_key(cluster)
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
        stop_all(procs)
    assert stall < STALL_BOUND_S, stall
    assert_same_as_reference(got, expected)
    assert counts == Counter(dict.fromkeys(expected, 1))  # each once, a's aborted sends unseen
    assert_debits_as_reference(cluster, tmp_path / "reference")
    takeovers = [p for p in procs if p is not a and "is no longer a member" in p.log.read_text()]
    assert takeovers, "the lease was not taken on the group's word"
    if fault == "SIGSTOP":
        log = a.log.read_text()
        assert "fenced" in log or "moved to another worker" in log
        assert "Traceback" not in log


def copy_ledger(cluster: Cluster, schema: str) -> None:
    """A consistent copy of the cluster's ledger in ``schema`` (a backup restored beside it):
    a ledger opened there, then every table's rows and every sequence's position copied in one
    snapshot."""
    import psycopg

    from streamfilter.runtime.store.cluster import ClusterLedger

    ClusterLedger(cluster.url, schema=schema).close()
    with psycopg.connect(cluster.url) as db:
        db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        tables = [
            t
            for (t,) in db.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (cluster.schema,),
            ).fetchall()
        ]
        for table in tables:
            conflict = (
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
                if table == "meta"
                else "ON CONFLICT DO NOTHING"
            )
            db.execute(
                f"INSERT INTO {schema}.{table} SELECT * FROM {cluster.schema}.{table} {conflict}"
            )
        for name, value in db.execute(
            "SELECT sequencename, last_value FROM pg_sequences WHERE schemaname = %s",
            (cluster.schema,),
        ).fetchall():
            if value is not None:  # as a restore sets them
                db.execute("SELECT setval(%s, %s)", (f"{schema}.{name}", value))


@pytest.mark.timeout(480)
def test_a_stale_releaser_never_stops_the_healthy_one(kafka_bootstrap, postgres_url, tmp_path):
    """Two workers publish day 1; a copy of the ledger is taken, days 2 to 10 arrive, and
    once day 2 is published the copy is restored beside the ledger and a third worker (same
    configuration and releases topic, the copy's schema and its own group) started on it. It
    becomes the releaser of its ledger, reads the releases topic before it takes it over, finds a
    later day there and exits 4 ("stale"), fencing no one: the healthy releaser never steps down
    and publishes the days after."""
    events = make_events(days=10, users=240, seed=33)
    expected = reference(tmp_path, events)
    days = by_day(events)
    cluster = Cluster(tmp_path, kafka_bootstrap, postgres_url)
    cluster.produce(days[0])
    procs = [cluster.worker("w0"), cluster.worker("w1")]
    stale_schema = f"{cluster.schema}_old"
    try:
        day1 = {key for key in expected if key[0] == "2026-01-01"}
        wait_until(lambda: day1 <= set(cluster.releases()) and all_sent(cluster), procs, 180, 1)
        copy_ledger(cluster, stale_schema)
        cluster.produce([e for day in days[1:] for e in day])  # one batch (module doc)
        cluster.wait_for({("2026-01-02", "active")}, procs, timeout=120)
        stale_config = cluster.work / "stale.toml"
        stale_config.write_text(
            (cluster.work / "cluster.toml")
            .read_text()
            .replace(f'pg_schema = "{cluster.schema}"', f'pg_schema = "{stale_schema}"')
            # an old copy of the deployment: its own consumer group, the same releases topic
            # and transactional id (what fencing guards); joining the healthy group instead
            # exposes a day-close race under rebalances that is still open (docs/cluster.md)
            .replace('group_id = "sf-', 'group_id = "stale-sf-')
        )
        (cluster.work / "stale").mkdir()
        from tests.runtime.io.test_kafka_daemon import spawn

        stale = spawn(
            ["run", "--config", str(stale_config), "--testing"],
            cwd=cluster.work / "stale",
            env=cluster.env,
        )
        assert stale.proc.wait(timeout=120) == 4, stale.tail()
        assert all(p.proc.poll() is None for p in procs)  # the healthy workers run on
        got = cluster.wait_for(set(expected), procs, timeout=180)
        time.sleep(2)  # nothing more arrives
        got = cluster.releases()
    finally:
        stop_all(procs)
    log = stale.log.read_text()
    assert "is stale" in log and "Traceback" not in log, log
    for proc in procs:
        assert "stepping down" not in proc.log.read_text(), proc.tail()
    assert_same_as_reference(got, expected)
    # a healthy worker published throughout; the lease may still pass between the two healthy
    # workers when the loaded machine lets it expire (seen once under the parallel suite), which
    # is the lease's own business, not the stale copy's
    releasers = [p for p in procs if "this worker is the releaser" in p.log.read_text()]
    assert releasers, [p.tail() for p in procs]
    assert_debits_as_reference(cluster, tmp_path / "reference")
    stale_days = cluster.sql(f"SELECT DISTINCT day FROM {stale_schema}.releases")
    assert stale_days == [("2026-01-01",)]  # the stale worker released nothing


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = admin_client(bootstrap)
    try:
        admin.delete_topics([topic])
        deadline = time.monotonic() + 60
        while topic in admin.list_topics():
            assert time.monotonic() < deadline, "the topic was not deleted"
            time.sleep(0.5)
    finally:
        admin.close()


def recreate_topics(cluster: Cluster) -> None:
    from tests.runtime.io.test_kafka_daemon import cli

    deadline = time.monotonic() + 60
    while True:  # the broker finishes the deletion before it accepts the name again
        made = cli(
            ["topics", "create", "--config", "cluster.toml"],
            cwd=cluster.work,
            env=cluster.env,
            check=False,
        )
        created = [
            line
            for line in made.stdout.splitlines()
            if line.startswith(cluster.topics["releases"]) and line.endswith("\tcreated")
        ]
        if made.returncode == 0 and created:
            return
        assert time.monotonic() < deadline, made.stdout + made.stderr
        time.sleep(1)


def error_lines(proc) -> list[str]:
    return [line for line in proc.log.read_text().splitlines() if "no longer exists" in line]


@pytest.mark.timeout(480)
def test_a_deleted_releases_topic_fails_the_cluster_closed_and_its_releases_come_back(
    kafka_bootstrap, postgres_url, tmp_path
):
    """Two workers without a test seed (real noise: a second draw would show). Days 1 and 2
    are published; the releases topic is deleted and day 3 arrives. Within seconds the
    releaser fails closed with one line naming the topic and steps down; no worker exits, and
    for the 30 s hold-off no worker tries again; the next try (reading the topic's tail) fails
    closed the same way. The topic is created again: the next
    releaser finds it empty, publishes days 1 and 2 again from their stored payloads (the
    values read before the deletion) and day 3 from the outbox."""
    events = make_events(days=3, users=240, seed=35)
    days = by_day(events)
    cluster = Cluster(tmp_path, kafka_bootstrap, postgres_url)
    config = cluster.work / "cluster.toml"
    config.write_text(config.read_text().replace("[testing]\nnoise_seed = 5\n", ""))
    assert "noise_seed" not in config.read_text()
    cluster.produce(days[0] + days[1])
    procs = [cluster.worker("w0"), cluster.worker("w1")]
    topic = cluster.topics["releases"]
    try:
        wait_until(
            lambda: ("2026-01-02", "active") in cluster.releases() and all_sent(cluster),
            procs,
            180,
            1,
        )
        before = released(kafka_bootstrap, topic)
        delete_topic(kafka_bootstrap, topic)
        cluster.produce(days[2])

        def lines() -> list[str]:
            return [line for p in procs for line in error_lines(p)]

        failed_in = wait_until(lambda: len(lines()) >= 1, procs, 120)
        # the next try, 30 s later, by whichever worker takes the role: it finds the topic
        # gone when it reads the topic's tail, and holds everyone off again; no exit meanwhile
        retried_in = wait_until(lambda: len(lines()) >= 2, procs, 90)
        assert retried_in > 25, retried_in  # the hold-off held
        time.sleep(10)
        assert len(lines()) == 2, lines()
        assert all(topic in line for line in lines())
        assert "Traceback" not in "".join(p.log.read_text() for p in procs)
        unsent = cluster.sql("SELECT count(*) FROM {s}.releases WHERE NOT sent")[0][0]
        assert unsent > 0  # day 3 waits in the outbox
        recreate_topics(cluster)
        keys = {(d, q) for d, q in cluster.sql("SELECT day, query_id FROM {s}.releases")}
        got = cluster.wait_for(keys, procs, timeout=120)
        time.sleep(2)  # nothing more arrives
        got = released(kafka_bootstrap, topic)
        counts = records_per_key(cluster)
    finally:
        stop_all(procs)
    print(f"\nreleases topic deleted: the releaser failed closed {failed_in:.1f} s after day 3")
    assert {k: v for k, v in got.items() if k in before} == before  # the stored noise
    stored = cluster.sql("SELECT day, query_id, payload FROM {s}.releases")
    assert got == {(d, q): {bytes(p)} for d, q, p in stored}  # as stored
    assert counts == Counter(dict.fromkeys(got, 1))  # each (day, query) once
    assert any(k[0] == "2026-01-03" for k in got)
    logs = "".join(p.log.read_text() for p in procs)
    assert "publishing them again with their stored noise" in logs
