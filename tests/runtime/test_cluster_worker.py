"""Cluster mode (docs/design.md §7) on a real Kafka broker, a real PostgreSQL server and real
worker processes: several ``streamfilter run`` of one configuration share the work.

Every test compares with the single-process SQLite run of the same events and queries under the
same test seed: noise is drawn per (day, query) from the seed, so the cluster must publish the
same bytes, each (day, query) once — which also shows that no user was charged or summed twice.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import signal
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.runtime.io.test_kafka_daemon import B_NORM, GAMMA, cli, make_events, released, spawn
from tests.support.kafka_broker import read_topic, unique_topic

pytestmark = pytest.mark.kafka

POLICY = "streamfilter.policies:drill_down"  # adaptive: day t+1's query from day t's release
PARTITIONS = 3


def _head(seed_section: str = "[testing]\nnoise_seed = 5\n") -> str:
    return f"""
[privacy]
b_norm = {B_NORM}
rho = 0.5
granularity = {GAMMA}
{seed_section}
[window]
allowed_lateness = "0s"
idle_timeout = "2s"
poll_interval = "0.2s"
[queries]
kind = "policy"
policy = "{POLICY}"
[metrics]
enabled = false
"""


def reference(tmp: Path, events: list[bytes]) -> dict[tuple[str, str], bytes]:
    """The single-process SQLite run (file source) of ``events``: (day, query_id) → bytes."""
    ref = tmp / "reference"
    ref.mkdir()
    (ref / "streamfilter.toml").write_text(
        _head()
        + '[state]\npath = "state.db"\n[source]\nkind = "file"\npath = "events.jsonl"\n'
        + '[sink]\nkind = "file"\npath = "releases.jsonl"\n'
        + "[telemetry]\npopulation = false\n"  # as in cluster mode, where it is not built
    )
    (ref / "events.jsonl").write_bytes(b"\n".join(events) + b"\n")
    cli(["run", "--config", "streamfilter.toml", "--until-end", "--testing"], cwd=ref)
    out = {}
    for line in (ref / "releases.jsonl").read_bytes().splitlines():
        obj = json.loads(line)
        out[(obj["day"], obj["query_id"])] = line
    return out


class Cluster:
    """Topics, a ledger schema and a worker configuration for one test."""

    def __init__(
        self, tmp: Path, bootstrap: str, postgres_url: str, delivery_timeout: str | None = None
    ) -> None:
        """``delivery_timeout``: the workers' ``[kafka] delivery_timeout`` (default: the
        config's)."""
        self.bootstrap = bootstrap
        self.work = tmp / "cluster"
        self.work.mkdir()
        self.topics = {k: unique_topic(k) for k in ("events", "releases", "rejects")}
        url = urlsplit(postgres_url)
        bare = urlunsplit(url._replace(netloc=f"{url.username}@{url.hostname}:{url.port}"))
        self.env = {"SF_TEST_PG_PASSWORD": url.password or ""}
        self.schema = f"cl_{uuid.uuid4().hex[:10]}"
        self.url = postgres_url
        head = _head().replace("[metrics]\nenabled = false", "[metrics]\nenabled = true\nport = 0")
        assert "port = 0" in head  # each worker serves /metrics on a port of its own
        (self.work / "cluster.toml").write_text(
            head
            + f"""
[cluster]
enabled = true
session_timeout = "6s"
heartbeat_interval = "1s"
max_poll_interval = "60s"
releaser_lease = "6s"
[state]
kind = "postgres"
url = "{bare}"
pg_schema = "{self.schema}"
password_env = "SF_TEST_PG_PASSWORD"
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "sf-{self.topics["events"]}"
{"" if delivery_timeout is None else f'delivery_timeout = "{delivery_timeout}"'}
[source]
kind = "kafka"
topic = "{self.topics["events"]}"
partitions = {PARTITIONS}
[sink]
kind = "kafka"
topic = "{self.topics["releases"]}"
[rejects]
kind = "kafka"
topic = "{self.topics["rejects"]}"
"""
        )
        cli(["topics", "create", "--config", "cluster.toml"], cwd=self.work, env=self.env)

    def produce(self, events: list[bytes], keys: list[bytes] | None = None) -> None:
        """Events keyed by user_id (Kafka's default partitioner), or by ``keys``."""
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        for i, ev in enumerate(events):
            key = keys[i] if keys is not None else user_key(ev)
            producer.send(self.topics["events"], key=key, value=ev)
        producer.flush()
        producer.close()

    def worker(self, name: str, env: dict[str, str] | None = None):
        cwd = self.work / name
        cwd.mkdir(exist_ok=True)
        return spawn(
            ["run", "--config", str(self.work / "cluster.toml"), "--testing"],
            cwd=cwd,
            env={**self.env, **(env or {})},
        )

    def releases(self) -> dict[tuple[str, str], set[bytes]]:
        return released(self.bootstrap, self.topics["releases"])

    def wait_for(self, keys: set[tuple[str, str]], workers, timeout: float):
        deadline = time.monotonic() + timeout
        got: dict[tuple[str, str], set[bytes]] = {}
        while time.monotonic() < deadline:
            for w in workers:
                assert w.poll() is None, w.tail()
            got = self.releases()
            if keys <= set(got):
                return got
            time.sleep(1)
        tails = "\n---\n".join(w.tail() for w in workers)
        raise AssertionError(f"missing {sorted(keys - set(got))[:5]} after {timeout}s\n{tails}")

    def sql(self, query: str) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url) as db:
            return list(db.execute(query.format(s=self.schema)).fetchall())


def metric(proc, name: str) -> float:
    """A counter's value on the worker's /metrics (its URL is in its start-up log)."""
    import re
    import urllib.request

    url = re.search(r"metrics on (http://\S+/metrics)", proc.log.read_text()).group(1)
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    )


def user_key(event: bytes) -> bytes:
    """The key an event is produced with: its user_id (a malformed line gets any key)."""
    try:
        return json.loads(event)["user_id"].encode()
    except ValueError:
        return b"garbage"


def by_day(events: list[bytes]) -> list[list[bytes]]:
    """``events`` cut into days, in day order (a malformed line goes with the day before it)."""
    days: dict[str, list[bytes]] = {}
    day = "2026-01-01"
    for ev in events:
        with contextlib.suppress(ValueError):
            day = json.loads(ev)["day"]
        days.setdefault(day, []).append(ev)
    return [days[d] for d in sorted(days)]


def stop_all(workers) -> None:
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(timeout=60) == 0, w.tail()


def assert_same_as_reference(got, expected) -> None:
    assert set(got) == set(expected), "a (day, query) is missing or unexpected"
    for key, values in got.items():
        assert values == {expected[key]}, f"{key}: {len(values)} distinct values"


def ledger_budgets(cluster: Cluster) -> dict[str, tuple[int, bool]]:
    """Every user's budget in the ledger: the merge of the partitions' budget records (per
    user the largest spend, retired if any record says so). No worker writes a budget row."""
    from streamfilter.runtime.store.schema import PackedBudgets

    assert cluster.sql("SELECT count(*) FROM {s}.budgets") == [(0,)]
    got: dict[str, tuple[int, bool]] = {}
    for n, *blobs in cluster.sql(
        "SELECT n_users, id_lengths, ids, spent_units, retired FROM {s}.cluster_budget_records"
    ):
        users, spent, retired = PackedBudgets(n, *map(bytes, blobs)).unpack("ledger")
        for u, sp, r in zip(users, spent, retired, strict=True):
            s0, r0 = got.get(u, (0, False))
            got[u] = (max(s0, sp), r0 or r)
    return got


def assert_debits_as_reference(cluster: Cluster, reference_dir: Path) -> None:
    """Every user's spent budget in the ledger is the single process's, and within B."""
    from tests.support.cli import stored_budgets

    want = {u: (s, r) for u, s, r in stored_budgets(reference_dir / "state.db")}
    assert ledger_budgets(cluster) == want
    assert max(s for s, _ in want.values()) <= int(B_NORM / GAMMA**2)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_workers_publish_the_single_process_releases(
    workers, kafka_bootstrap, postgres_url, tmp_path
):
    events = make_events(days=4, users=240, seed=workers)
    expected = reference(tmp_path, events)
    assert any(q.startswith("focus-") for _, q in expected)  # the adaptive query is in play
    cluster = Cluster(tmp_path, kafka_bootstrap, postgres_url)
    cluster.produce(events)
    procs = [cluster.worker(f"w{i}") for i in range(workers)]
    try:
        got = cluster.wait_for(set(expected), procs, timeout=240)
        time.sleep(2)  # nothing more arrives
        got = cluster.releases()
        published = sum(metric(p, "streamfilter_releases_published_total") for p in procs)
        last_closed = {metric(p, "streamfilter_last_closed_day_timestamp_seconds") for p in procs}
    finally:
        stop_all(procs)
    assert published >= len(expected)  # the releaser's /metrics count what it published
    last_day = max(day for day, _ in expected)
    midnight = datetime.datetime.fromisoformat(last_day).replace(tzinfo=datetime.UTC)
    assert last_closed == {midnight.timestamp()}  # every worker shows the cluster's last day
    assert_same_as_reference(got, expected)
    assert_debits_as_reference(cluster, tmp_path / "reference")
    writers = {w for (w,) in cluster.sql("SELECT DISTINCT worker FROM {s}.cluster_commits")}
    assert len(writers) <= workers
    rejects = [
        json.loads(r.value)["reason"]
        for r in read_topic(kafka_bootstrap, cluster.topics["rejects"])
    ]
    assert rejects == ["malformed_json"] * events.count(b"{not json")


@pytest.mark.timeout(300)
def test_mis_keyed_events_are_rejected_and_never_counted(kafka_bootstrap, postgres_url, tmp_path):
    """Events produced with a key that sends them to another partition than their user's are
    refused as ``wrong_partition``: the releases are those of the correctly keyed events alone,
    so no user is charged or summed twice."""
    from kafka.partitioner.default import murmur2

    good = make_events(days=3, users=200, seed=7)
    expected = reference(tmp_path, good)
    cluster = Cluster(tmp_path, kafka_bootstrap, postgres_url)

    def partition_of(key: bytes) -> int:
        return (murmur2(key) & 0x7FFFFFFF) % PARTITIONS

    bad, keys = [], []
    for line in good[:200]:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        user = obj["user_id"].encode()
        # the same user's event again, under a key that lands on another partition
        key = next(
            k for i in range(100) if partition_of(k := b"other-%d" % i) != partition_of(user)
        )
        bad.append(json.dumps({**obj, "event_id": obj.get("event_id", "") + "-dup"}).encode())
        keys.append(key)
    good_keys = [user_key(e) for e in good]
    cluster.produce(good + bad, keys=good_keys + keys)
    procs = [cluster.worker("w0"), cluster.worker("w1")]
    try:
        cluster.wait_for(set(expected), procs, timeout=200)
        time.sleep(2)
        got = cluster.releases()
    finally:
        stop_all(procs)
    assert_same_as_reference(got, expected)
    assert_debits_as_reference(cluster, tmp_path / "reference")
    reasons = [
        json.loads(r.value)["reason"]
        for r in read_topic(kafka_bootstrap, cluster.topics["rejects"])
    ]
    assert reasons.count("wrong_partition") == len(bad)


def wait_for_log(proc, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in proc.log.read_text(errors="replace"):
            return
        assert proc.poll() is None, proc.tail()
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not logged within {timeout}s\n{proc.tail()}")


def worker_id(proc) -> str:
    for line in proc.log.read_text(errors="replace").splitlines():
        if "cluster worker " in line and " started" in line:
            return line.split("cluster worker ", 1)[1].split(" started", 1)[0]
    raise AssertionError(f"no worker id logged\n{proc.tail()}")


@pytest.mark.timeout(300)
def test_a_zombie_worker_cannot_commit_after_the_group_moved_on(
    kafka_bootstrap, postgres_url, tmp_path
):
    """Worker A (started first: the releaser) stops (SIGSTOP) right before its first day-close
    commit; the group gives its partitions to B, and its releaser lease expires and passes to
    B, which closes and releases every day alone; A continues (SIGCONT): its commit is refused
    by the epoch check, it steps down as the releaser, and nothing A computed is released."""
    events = make_events(days=4, users=240, seed=11)
    expected = reference(tmp_path, events)
    cluster = Cluster(tmp_path, kafka_bootstrap, postgres_url)
    cluster.produce(events)
    a = cluster.worker("a", env={"STREAMFILTER_PAUSE_AT": "before_partition_commit:3"})
    wait_for_log(a, "this worker is the releaser", 60)
    b = cluster.worker("b")
    try:
        wait_for_log(a, "pausing 3s at crash point before_partition_commit", 120)
        a.send_signal(signal.SIGSTOP)
        got = cluster.wait_for(set(expected), [b], timeout=180)
        a.send_signal(signal.SIGCONT)
        wait_for_log(a, "epoch moved on", 60)
        wait_for_log(a, "stepping down as the releaser", 60)
        time.sleep(3)  # A rejoins the group; there is nothing left for it to commit
        got = cluster.releases()
    finally:
        a.send_signal(signal.SIGCONT)
        stop_all([a, b])
    assert_same_as_reference(got, expected)
    assert_debits_as_reference(cluster, tmp_path / "reference")
    writers = {w for (w,) in cluster.sql("SELECT DISTINCT worker FROM {s}.cluster_commits")}
    assert writers == {worker_id(b)}
    releasers = {w for (w,) in cluster.sql("SELECT DISTINCT releaser FROM {s}.cluster_days")}
    assert releasers == {worker_id(b)}
    released = cluster.sql("SELECT day, query_id FROM {s}.releases")
    assert sorted(released) == sorted(expected)  # each (day, query) stored once


@pytest.mark.timeout(400)
def test_workers_joining_and_leaving_mid_run_change_nothing(
    kafka_bootstrap, postgres_url, tmp_path
):
    """Two workers start; a third joins after day 2 is released; one of the first two stops
    (SIGTERM) after day 4: the group rebalances by itself each time, and the releases are the
    single process's."""
    events = make_events(days=6, users=240, seed=13)
    expected = reference(tmp_path, events)
    days = by_day(events)
    cluster = Cluster(tmp_path, kafka_bootstrap, postgres_url)
    cluster.produce([e for d in days[:3] for e in d])
    procs = [cluster.worker("w0"), cluster.worker("w1")]
    try:
        cluster.wait_for({("2026-01-02", "active")}, procs, timeout=120)
        procs.append(cluster.worker("w2"))
        wait_for_log(procs[2], "assigned partition", 60)
        cluster.produce([e for d in days[3:5] for e in d])
        cluster.wait_for({("2026-01-04", "active")}, procs, timeout=120)
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=60) == 0, procs[0].tail()
        cluster.produce([e for d in days[5:] for e in d])
        got = cluster.wait_for(set(expected), procs[1:], timeout=120)
        time.sleep(2)
        got = cluster.releases()
    finally:
        stop_all(procs)
    assert_same_as_reference(got, expected)
    assert_debits_as_reference(cluster, tmp_path / "reference")
    writers = {w for (w,) in cluster.sql("SELECT DISTINCT worker FROM {s}.cluster_commits")}
    assert len(writers) == 3  # every worker did a share


@pytest.mark.timeout(300)
def test_workers_starting_together_read_each_record_once(kafka_bootstrap, postgres_url, tmp_path):
    """Two workers started at once over input already produced: the group assigns each its
    partitions once they have both joined (a worker reads nothing until its assignment has held
    for ``[cluster] assignment_settle``), so no record is read twice — the records read,
    summed over the workers, are the records produced — and the releases are the single
    process's. Without the wait (``assignment_settle = "0s"``) the second worker's join moved
    partitions the first had read: 402 records read of 295 produced."""
    events = make_events(days=3, users=240, seed=19)
    expected = reference(tmp_path, events)
    cluster = Cluster(tmp_path, kafka_bootstrap, postgres_url)
    cluster.produce(events)
    # longer than the default 5 s: two interpreters starting on a loaded test machine (under
    # the parallel suite the second one's start-up was seen to take more than 10 s)
    settle = {"STREAMFILTER_CLUSTER__ASSIGNMENT_SETTLE": "20s"}
    procs = [cluster.worker("w0", env=settle), cluster.worker("w1", env=settle)]
    try:
        got = cluster.wait_for(set(expected), procs, timeout=200)
        time.sleep(2)
        got = cluster.releases()
        read = [metric(p, "streamfilter_records_consumed_total") for p in procs]
    finally:
        stop_all(procs)
    assert_same_as_reference(got, expected)
    assert all(n > 0 for n in read), read  # both did a share
    assert sum(read) == len(events), f"read {read} of {len(events)} produced"


def restricted_role(cluster: Cluster) -> None:
    """Make the workers connect as a new role with no superuser (nor role-, database- or
    schema-creation) rights that owns nothing: the admin creates the ledger and grants the
    role its rights (``runtime/store/setup.py``), the workers only use it."""
    import psycopg

    from streamfilter.runtime.store.setup import set_up

    role, password = f"sf_w_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(cluster.url, autocommit=True) as db:
        db.execute(
            f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '{password}'"
        )
        db.execute(f"REVOKE CREATE ON SCHEMA public FROM {role}")
    set_up(cluster.url, schema=cluster.schema, worker_role=role)
    config = cluster.work / "cluster.toml"
    url = urlsplit(cluster.url)
    text = config.read_text().replace(f"{url.username}@", f"{role}@", 1)
    assert f"{role}@" in text
    config.write_text(text)
    cluster.env["SF_TEST_PG_PASSWORD"] = password
    with psycopg.connect(cluster.url) as db:
        assert db.execute(
            "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = %s", (role,)
        ).fetchone() == (False, False, False)


@pytest.mark.timeout(600)
def test_sigkill_at_named_crash_points_as_a_restricted_role(
    kafka_bootstrap, postgres_url, tmp_path
):
    """Workers running as a non-superuser role are SIGKILLed at the named crash points — after
    the partial-sum commit, after the release insert, after publishing, before marking sent —
    and the others with them; restarted each time, the cluster publishes every (day, query)
    with the single process's value (no second noise draw), none missing, and every user's
    spent budget is the single process's (so none above B)."""
    events = make_events(days=10, users=200, seed=17)
    expected = reference(tmp_path, events)
    days = by_day(events)
    cluster = Cluster(tmp_path, kafka_bootstrap, postgres_url)
    restricted_role(cluster)
    points = ["after_partition_commit", "after_release_insert", "after_publish", "before_mark_sent"]
    for i, point in enumerate(points):
        cluster.produce([e for d in days[2 * i : 2 * i + 2] for e in d])
        crashing = cluster.worker(f"crash{i}", env={"STREAMFILTER_CRASH_AT": f"{point}:1"})
        wait_for_log(crashing, "this worker is the releaser", 120)
        other = cluster.worker(f"other{i}")
        assert crashing.wait(timeout=120) == -signal.SIGKILL, (point, crashing.tail())
        other.send_signal(signal.SIGKILL)  # and the other one at a moment of no importance
        other.wait(timeout=30)
    cluster.produce([e for d in days[2 * len(points) :] for e in d])
    procs = [cluster.worker("final0"), cluster.worker("final1")]
    try:
        got = cluster.wait_for(set(expected), procs, timeout=240)
        time.sleep(2)
        got = cluster.releases()
    finally:
        stop_all(procs)
    assert_same_as_reference(got, expected)
    assert_debits_as_reference(cluster, tmp_path / "reference")
    assert sorted(cluster.sql("SELECT day, query_id FROM {s}.releases WHERE sent")) == sorted(
        expected
    )
