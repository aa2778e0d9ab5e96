"""The cluster ledger's transactions on a real PostgreSQL server (docs/design.md §7.2, §7.3):
epochs fence a worker that lost its partition, the day barrier orders days, a day is released
once, and a conflicting transaction is retried rather than failed."""

from __future__ import annotations

import dataclasses
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pytest

from streamfilter.engine.contract import Reject
from streamfilter.engine.day import DayPartial
from streamfilter.engine.partitions import key_partition
from streamfilter.errors import StoreError
from streamfilter.runtime.store import Position
from streamfilter.runtime.store.cluster import (
    ClusterLedger,
    PartitionFencedError,
    ReleaserFencedError,
)
from streamfilter.runtime.store.schema import PackedBudgets

DAY1, DAY2 = "2026-01-01", "2026-01-02"


@pytest.fixture
def ledgers(postgres_url):
    url = urlsplit(postgres_url)
    bare = urlunsplit(url._replace(netloc=f"{url.username}@{url.hostname}:{url.port}"))
    schema = f"led_{uuid.uuid4().hex[:10]}"
    opened = [ClusterLedger(bare, schema=schema, password=url.password) for _ in range(2)]
    yield opened
    for ledger in opened:
        ledger.close()


def part(day: str, users: dict[str, int], sums: list[int]) -> DayPartial:
    return DayPartial(
        day=day,
        sums={"q": np.array(sums, np.int64)},
        counters={"users_with_records": len(users)},
        changed_users=np.array(list(users), dtype=object),
        spent_units=np.array(list(users.values()), np.int64),
        retired=np.zeros(len(users), bool),
    )


def test_a_worker_that_lost_its_partition_commits_nothing(ledgers):
    a, b = ledgers
    epochs_a = {p: c.epoch for p, c in a.claim([0, 1], "a").items()}
    a.pin_day(DAY1, 2)
    assert a.freeze_day(DAY1)
    epochs_b = {p: c.epoch for p, c in b.claim([1], "b").items()}  # a rebalance moved 1 to b
    assert epochs_b[1] == epochs_a[1] + 1
    with pytest.raises(PartitionFencedError):
        a.commit_partitions(
            DAY1,
            "a",
            epochs_a,
            {0: part(DAY1, {"u0": 5}, [1]), 1: part(DAY1, {"u1": 7}, [2])},
            {0: Position(3, 3), 1: Position(4, 4)},
            2,
        )
    assert a.spent_units("u0") is None  # nothing of the refused commit exists
    assert b._read("SELECT count(*) FROM {s}.cluster_partials") == [(0,)]
    # the partition a still holds commits; b commits its own; then the day releases once
    a.commit_partitions(
        DAY1, "a", {0: epochs_a[0]}, {0: part(DAY1, {"u0": 5}, [1])}, {0: Position(3, 3)}, 2
    )
    assert not b.release_day(
        DAY1, lambda sums, counters, coverage: ([], None)
    )  # partition 1 is missing
    b.commit_partitions(
        DAY1, "b", epochs_b, {1: part(DAY1, {"u1": 7}, [2])}, {1: Position(4, 4)}, 2
    )
    seen = {}

    def make(sums, counters, coverage):
        seen.update(sums=sums, counters=counters, coverage=coverage)
        return [("q", b"release")], b'{"tracker": 1}'

    assert b.release_day(DAY1, make)
    assert seen["sums"]["q"].tolist() == [3] and seen["counters"] == {"users_with_records": 2}
    assert seen["coverage"] is None and a.coverage_state() == b'{"tracker": 1}'  # same commit
    assert not a.release_day(DAY1, make)  # released once
    assert a.unsent_releases() == [(DAY1, "q", b"release")]
    assert (a.spent_units("u0"), a.spent_units("u1")) == ((5, False), (7, False))


def _users_of(partition: int, partitions: int, n: int, prefix: str = "u") -> list[str]:
    """``n`` user ids that Kafka's partitioner maps to ``partition`` of ``partitions``."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        user = f"{prefix}{i}"
        if key_partition(user.encode(), partitions) == partition:
            out.append(user)
        i += 1
    return out


def _close(ledger: ClusterLedger, day: str, epochs, parts, partitions: int) -> None:
    """Freeze, commit ``parts`` and release ``day`` (no queries)."""
    ledger.pin_day(day, partitions)
    assert ledger.freeze_day(day)
    positions = {p: Position(0, 0) for p in parts}
    ledger.commit_partitions(day, "a", epochs, parts, positions, partitions)
    assert ledger.release_day(day, lambda sums, counters, coverage: ([], None))


def test_a_partitions_budgets_are_rebuilt_from_its_records(ledgers):
    """Each day's commit appends one packed record per partition (no per-user row); a rebuild
    merges the partition's records — per user the latest spend, retired once retired — and
    reads nothing of the other partitions."""
    a, _ = ledgers
    epochs = {p: c.epoch for p, c in a.claim([0, 1], "a").items()}
    u0, u1 = _users_of(0, 2, 3), _users_of(1, 2, 2)
    day1 = {
        0: part(DAY1, dict(zip(u0, [4, 5, 6], strict=True)), [0]),
        1: part(DAY1, {u1[0]: 9}, [0]),
    }
    day1[0] = dataclasses.replace(day1[0], retired=np.array([False, True, False]))
    _close(a, DAY1, epochs, day1, 2)
    day2 = {0: part(DAY2, {u0[0]: 8, u0[2]: 7}, [0]), 1: part(DAY2, {u1[1]: 1}, [0])}
    _close(a, DAY2, epochs, day2, 2)
    rows = a._read("SELECT day, partition, n_users FROM {s}.cluster_budget_records ORDER BY seq")
    assert rows == [(DAY1, 0, 3), (DAY1, 1, 1), (DAY2, 0, 2), (DAY2, 1, 1)]
    assert a._read("SELECT count(*) FROM {s}.budgets") == [(0,)]
    rebuilt = a.partition_budgets(0, 2)
    assert sorted(rebuilt.items()) == sorted(
        [(u0[0], 8, False), (u0[1], 5, True), (u0[2], 7, False)]
    )
    assert sorted(a.partition_budgets(1, 2).items()) == sorted(
        [(u1[0], 9, False), (u1[1], 1, False)]
    )


def test_a_grown_topic_rebuilds_each_partition_from_the_users_that_map_to_it(ledgers):
    """Partitions added (the next day pinned with a larger count): a partition's budgets under
    the new count are those of the users that map to it now, wherever their records were
    written."""
    a, _ = ledgers
    epochs = {p: c.epoch for p, c in a.claim([0, 1, 2], "a").items()}
    users = _users_of(0, 2, 6) + _users_of(1, 2, 6)
    spent = {u: i + 1 for i, u in enumerate(users)}
    by_part = {
        p: {u: s for u, s in spent.items() if key_partition(u.encode(), 2) == p} for p in (0, 1)
    }
    _close(
        a, DAY1, {0: epochs[0], 1: epochs[1]}, {p: part(DAY1, by_part[p], [0]) for p in (0, 1)}, 2
    )
    for p in range(3):
        want = {u: s for u, s in spent.items() if key_partition(u.encode(), 3) == p}
        assert {u: s for u, s, _ in a.partition_budgets(p, 3).items()} == want


def test_days_close_in_order(ledgers):
    a, _ = ledgers
    epochs = {p: c.epoch for p, c in a.claim([0], "a").items()}
    a.pin_day(DAY2, 1)
    a.pin_day(DAY1, 1)
    assert a.freeze_day(DAY1)  # the first freeze pins the first day
    assert not a.freeze_day(DAY2)  # day 2 waits for day 1's release
    with pytest.raises(StoreError, match="day barrier"):
        a.commit_partitions(DAY2, "a", epochs, {0: part(DAY2, {}, [0])}, {0: Position(0, 0)}, 1)
    a.commit_partitions(DAY1, "a", epochs, {0: part(DAY1, {}, [0])}, {0: Position(0, 0)}, 1)
    assert a.release_day(DAY1, lambda sums, counters, coverage: ([], None))
    assert a.freeze_day(DAY2)


def test_queries_are_one_list_and_frozen_days_refuse_new_ones(ledgers):
    a, b = ledgers
    q1 = b'{"from_day":"2026-01-01","query_id":"q1"}'
    a.add_query(q1)
    b.add_query(q1)  # the same definition again: nothing changes
    with pytest.raises(Reject, match="another definition"):
        b.add_query(b'{"from_day":"2026-01-03","query_id":"q1"}')
    a.pin_day(DAY1, 1)
    assert a.freeze_day(DAY1)
    with pytest.raises(Reject, match="frozen"):
        b.add_query(b'{"from_day":"2026-01-01","query_id":"q2"}')
    b.add_query(b'{"from_day":"2026-01-02","query_id":"q3"}')
    assert a.queries_after(0) == [q1, b'{"from_day":"2026-01-02","query_id":"q3"}']
    assert a.queries_after(1) == [b'{"from_day":"2026-01-02","query_id":"q3"}']


def test_one_releaser_at_a_time_and_a_stale_one_releases_nothing(ledgers):
    a, b = ledgers
    token_a = a.hold_releaser_lease("a", None, 0.5)
    assert token_a == 1
    assert b.hold_releaser_lease("b", None, 0.5) is None  # a's lease is live
    assert a.hold_releaser_lease("a", token_a, 0.5) == token_a  # renewed
    a.claim([0], "a")
    a.pin_day(DAY1, 1)
    assert a.freeze_day(DAY1)
    epochs = {0: 1}
    a.commit_partitions(DAY1, "a", epochs, {0: part(DAY1, {}, [0])}, {0: Position(0, 0)}, 1)
    time.sleep(1.0)  # a stops for longer than its lease
    token_b = b.hold_releaser_lease("b", None, 0.5)
    assert token_b == token_a + 1
    with pytest.raises(ReleaserFencedError):
        a.release_day(
            DAY1, lambda sums, counters, coverage: ([("q", b"a")], None), lease=("a", token_a)
        )
    assert a.hold_releaser_lease("a", token_a, 0.5) is None  # a learns it is not the releaser
    assert b.release_day(
        DAY1, lambda sums, counters, coverage: ([("q", b"b")], None), lease=("b", token_b)
    )
    assert a.unsent_releases() == [(DAY1, "q", b"b")]


def test_a_lease_whose_holder_left_the_group_is_taken_at_once_and_fences_the_holder(ledgers):
    """Before its lease expires, a's lease passes to b only when b's membership check says a
    has left the group; a, back, can neither renew it nor release with it."""
    a, b = ledgers
    token_a = a.hold_releaser_lease("a", None, 60)
    asked: list[str] = []

    def still_member(holder: str) -> bool:
        asked.append(holder)
        return False

    assert b.hold_releaser_lease("b", None, 60, still_member) is None
    assert asked == ["a"]
    assert a.hold_releaser_lease("a", token_a, 60, still_member) == token_a  # no question
    assert asked == ["a"]
    token_b = b.hold_releaser_lease("b", None, 60, lambda holder: holder == "a")
    assert token_b == token_a + 1  # long before the 60 s expiry
    assert a.hold_releaser_lease("a", token_a, 60) is None
    a.claim([0], "a")
    a.pin_day(DAY1, 1)
    assert a.freeze_day(DAY1)
    a.commit_partitions(DAY1, "a", {0: 1}, {0: part(DAY1, {}, [0])}, {0: Position(0, 0)}, 1)
    with pytest.raises(ReleaserFencedError):
        a.release_day(
            DAY1, lambda sums, counters, coverage: ([("q", b"a")], None), lease=("a", token_a)
        )
    assert b.release_day(
        DAY1, lambda sums, counters, coverage: ([("q", b"b")], None), lease=("b", token_b)
    )
    assert a.unsent_releases() == [(DAY1, "q", b"b")]


def test_a_lease_is_taken_from_the_holder_that_left_only_if_it_is_still_that_holders(
    ledgers, postgres_url
):
    """The membership check runs outside the transaction: when the lease moved on meanwhile
    (here: a third worker took it while b was asking), b takes nothing."""
    a, b = ledgers
    c = ClusterLedger(postgres_url, schema=a.schema)
    try:
        token_a = a.hold_releaser_lease("a", None, 60)

        def left_while_c_takes_over(holder: str) -> bool:
            assert c.hold_releaser_lease("c", None, 60, lambda h: h == "a") == token_a + 1
            return True

        assert b.hold_releaser_lease("b", None, 60, left_while_c_takes_over) is None
        assert c.hold_releaser_lease("c", token_a + 1, 60) == token_a + 1
    finally:
        c.close()


def test_a_worker_never_waits_for_a_lease_row_the_releaser_has_locked(ledgers, postgres_url):
    """A releaser stopped inside its release transaction keeps the lease row locked until the
    server ends its session: the other workers get None at once and go on with their
    partitions (they used to wait with it)."""
    import psycopg

    a, b = ledgers
    a.hold_releaser_lease("a", None, 0.1)
    time.sleep(0.3)  # expired: b would take it, were the row not locked
    with psycopg.connect(postgres_url) as stopped:
        stopped.execute(f"SELECT * FROM {a.schema}.cluster_releaser FOR UPDATE")
        started = time.monotonic()
        assert b.hold_releaser_lease("b", None, 30, lambda holder: True) is None
        assert time.monotonic() - started < 2
    assert b.hold_releaser_lease("b", None, 30) == 2  # the lock gone, the expired lease is b's


def test_a_releaser_without_a_topic_holds_every_worker_off_the_role(ledgers):
    """``hold_off_releasers``: for the given time no worker takes the lease, its holder
    included (it gave its token up), however the membership check answers; then the next one
    does."""
    a, b = ledgers
    token_a = a.hold_releaser_lease("a", None, 0.2)
    a.hold_off_releasers("a", token_a, 1.0)
    time.sleep(0.5)  # past the 0.2 s lease
    assert b.hold_releaser_lease("b", None, 0.2) is None
    assert a.hold_releaser_lease("a", None, 0.2, lambda holder: True) is None
    time.sleep(0.7)
    assert b.hold_releaser_lease("b", None, 0.2) == token_a + 1
    a.hold_off_releasers("a", token_a, 60)  # a no longer holds it: nothing changes
    time.sleep(0.3)
    assert a.hold_releaser_lease("a", None, 0.2) == token_a + 2


def test_workers_starting_together_charge_coverage_once(postgres_url):
    """Coverage's one-time telemetry charge (docs/design.md §2.11) is made by the first worker;
    the others, starting at the same moment, find it made: one charge, one tracker."""
    import threading

    from streamfilter.runtime.store import TelemetryCharge

    url = urlsplit(postgres_url)
    bare = urlunsplit(url._replace(netloc=f"{url.username}@{url.hostname}:{url.port}"))
    schema = f"cov_{uuid.uuid4().hex[:10]}"
    opened = [ClusterLedger(bare, schema=schema, password=url.password) for _ in range(5)]
    start = threading.Barrier(len(opened))
    errors: list[BaseException] = []

    def charge(ledger: ClusterLedger, i: int) -> None:
        start.wait()
        try:
            ledger.charge_telemetry(
                TelemetryCharge("coverage", 0.02, b"{}"),
                0.05,
                coverage_state=b'{"worker": %d}' % i,
            )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=charge, args=(led, i)) for i, led in enumerate(opened)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        charges = opened[0].telemetry_ledger()
        assert [c.kind for c in charges] == ["coverage"]
        states = {led.coverage_state() for led in opened}
        assert len(states) == 1 and states != {None}
    finally:
        for ledger in opened:
            ledger.close()


def test_workers_starting_at_once_on_a_new_schema_all_start(postgres_url):
    """Workers started together (a deployment's replicas) all create the ledger's schema and
    tables at once: every one opens it (the DDL lock is taken before the transaction's
    snapshot, so a later creator sees the first one's schema instead of creating it again)."""
    url = urlsplit(postgres_url)
    bare = urlunsplit(url._replace(netloc=f"{url.username}@{url.hostname}:{url.port}"))
    for _ in range(3):  # the race is narrow: a few rounds make a wrong lock fail reliably
        opened, failed = open_at_once(bare, url.password or "", f"led_{uuid.uuid4().hex[:10]}", 6)
        assert not failed, failed
        assert len(opened) == 6


def open_at_once(url: str, password: str, schema: str, n: int):
    """``n`` ledgers on ``schema`` opened by ``n`` threads released together."""
    import threading

    start = threading.Barrier(n)
    opened: list[ClusterLedger] = []
    failed: list[BaseException] = []

    def open_one() -> None:
        start.wait()
        try:
            opened.append(ClusterLedger(url, schema=schema, password=password))
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for ledger in opened:
        ledger.close()
    return opened, failed


def test_the_fold_keeps_every_partitions_budgets_and_lowers_none(ledgers):
    """The administrator's fold merges every record into one per partition of the latest
    count: rebuilds give the same budgets before and after, and a lower record appended before
    the fold lowers nothing."""
    a, _ = ledgers
    epochs = {p: c.epoch for p, c in a.claim([0, 1], "a").items()}
    u0, u1 = _users_of(0, 2, 4), _users_of(1, 2, 3)
    _close(a, DAY1, epochs, {0: part(DAY1, dict.fromkeys(u0, 5), [0]), 1: part(DAY1, {}, [0])}, 2)
    _close(
        a,
        DAY2,
        epochs,
        {0: part(DAY2, {u0[0]: 9}, [0]), 1: part(DAY2, dict.fromkeys(u1, 2), [0])},
        2,
    )
    lower = PackedBudgets.of(np.array(u0, dtype=object), np.zeros(4), np.zeros(4, bool))
    with a._transaction() as cur:  # a record of lower spends, as a hostile worker appends it
        cur.execute(
            f"SELECT {a.schema}.sf_append_budgets(%s, %s, %s, %s, %s, %s, %s, %s)",
            (DAY2, 2, 0, *lower.values()),
        )
    before = [sorted(a.partition_budgets(p, 2).items()) for p in (0, 1)]
    assert before[0] == sorted([(u0[0], 9, False)] + [(u, 5, False) for u in u0[1:]])
    assert a.fold_budgets() == 4
    rows = a._read("SELECT partitions, partition, n_users FROM {s}.cluster_budget_records")
    assert sorted(rows) == [(2, 0, 4), (2, 1, 3)]
    assert [sorted(a.partition_budgets(p, 2).items()) for p in (0, 1)] == before
    assert a.fold_budgets() == 2  # folding again changes nothing
    assert [sorted(a.partition_budgets(p, 2).items()) for p in (0, 1)] == before
    # the erase guard is back once the fold committed
    with pytest.raises(StoreError), a._transaction() as cur:
        cur.execute(f"DELETE FROM {a.schema}.cluster_budget_records")
