"""Contract suite for StateStore: every implementation runs these tests."""

import dataclasses
import sqlite3
import subprocess
import sys
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamfilter.runtime.store import (
    DayCommit,
    Position,
    SQLiteStateReader,
    SQLiteStateStore,
    StoreError,
    StoreLockedError,
)
from streamfilter.runtime.store.postgres import PostgresStateStore
from streamfilter.runtime.store.schema import row_crc

#: how a second process opens the same state (for the single-writer test)
_OPEN_IN_CHILD = {
    "sqlite": "from streamfilter.runtime.store import SQLiteStateStore as S\nS({0!r})",
    "postgres": "from streamfilter.runtime.store.postgres import PostgresStateStore as S\n"
    "S({0!r}, schema={1!r})",
}


@pytest.fixture(params=["sqlite", "postgres"])
def make_store(request, tmp_path):
    """Opens the same state each call; ``make_store.where`` says how another process opens it."""
    opened = []
    if request.param == "sqlite":
        args: tuple[str, ...] = (str(tmp_path / "state.db"),)

        def open_store():
            return SQLiteStateStore(args[0])
    else:
        args = (request.getfixturevalue("postgres_url"), f"state_{uuid.uuid4().hex[:12]}")

        def open_store():
            return PostgresStateStore(args[0], schema=args[1])

    def factory():
        store = open_store()
        opened.append(store)
        return store

    factory.child_code = _OPEN_IN_CHILD[request.param].format(*args)
    yield factory
    for s in opened:
        s.close()


def commit(day, users, spent, releases, positions=None):
    return DayCommit(
        day=day,
        releases=releases,
        changed_users=np.array(users, dtype=object),
        spent_units=np.array(spent, dtype=np.int64),
        retired=np.zeros(len(users), bool),
        positions=positions or {"p0": Position(10, 12)},
    )


def test_day_commit_round_trips(make_store):
    store = make_store()
    assert store.load().last_closed_day is None
    seq = store.commit_day(
        commit("2026-01-01", ["a", "b"], [5, 7], [("q1", b'{"v":1}'), ("q2", b'{"v":2}')])
    )
    assert seq == 1
    store.commit_day(
        commit("2026-01-02", ["a"], [9], [("q1", b'{"v":3}')], {"p0": Position(20, 25)})
    )
    state = store.load()
    assert state.seq == 2 and state.last_closed_day == "2026-01-02"
    assert sorted(state.budgets) == [("a", 9, False), ("b", 7, False)]
    assert state.positions == {"p0": Position(20, 25)}
    assert state.releases == [b'{"v":1}', b'{"v":2}', b'{"v":3}']
    assert store.spent_units("a") == (9, False) and store.spent_units("zz") is None


def test_the_population_counters_are_stored_with_their_day(make_store):
    """The population estimate's state (exact partial sums: sensitive) is committed with the day
    and returned by load(); a day without it keeps the last one."""
    store = make_store()
    assert store.load().population_state is None
    first = dataclasses.replace(commit("2026-01-01", ["a"], [5], []), population_state=b'{"s":1}')
    store.commit_day(first)
    store.commit_day(commit("2026-01-02", ["a"], [6], []))
    assert store.load().population_state == b'{"s":1}'
    store.commit_day(
        dataclasses.replace(commit("2026-01-03", ["a"], [7], []), population_state=b'{"s":3}')
    )
    assert store.load().population_state == b'{"s":3}'


def test_outbox_until_marked_sent(make_store):
    store = make_store()
    store.commit_day(commit("2026-01-01", [], [], [("q1", b"x"), ("q2", b"y")]))
    assert store.unsent_releases() == [("2026-01-01", "q1", b"x"), ("2026-01-01", "q2", b"y")]
    store.mark_sent([("2026-01-01", "q1")])
    assert store.unsent_releases() == [("2026-01-01", "q2", b"y")]


def test_a_release_is_stored_once_and_a_failed_commit_changes_nothing(make_store):
    store = make_store()
    store.commit_day(commit("2026-01-01", ["a"], [5], [("q1", b"x")]))
    with pytest.raises(StoreError):
        # same (day, query) again: the whole transaction is refused, budgets included
        store.commit_day(commit("2026-01-01", ["a"], [100], [("q1", b"other noise")]))
    state = store.load()
    assert state.budgets == [("a", 5, False)] and state.releases == [b"x"] and state.seq == 1


def test_queries_are_kept_in_registration_order(make_store):
    store = make_store()
    for qid in ("zeta", "alpha", "mid"):
        store.add_query(f'{{"query_id": "{qid}"}}'.encode())
    store.add_query(b'{"query_id": "alpha"}')  # idempotent
    assert [q for q in store.load().queries] == [
        b'{"query_id": "zeta"}',
        b'{"query_id": "alpha"}',
        b'{"query_id": "mid"}',
    ]


def test_a_batch_of_queries_is_one_ordered_idempotent_registration(make_store):
    store = make_store()
    store.add_query(b'{"query_id": "b"}')
    store.add_queries([b'{"query_id": "a"}', b'{"query_id": "b", "x": 1}', b'{"query_id": "c"}'])
    store.add_queries([])
    # "b" keeps its first payload; the batch's new ids follow in their order
    assert store.load().queries == [
        b'{"query_id": "b"}',
        b'{"query_id": "a"}',
        b'{"query_id": "c"}',
    ]


def test_state_survives_reopen(make_store, tmp_path):
    store = make_store()
    store.commit_day(commit("2026-01-01", ["a"], [5], [("q1", b"x")]))
    store.close()
    again = make_store()
    assert again.load().budgets == [("a", 5, False)]


def test_second_writer_is_refused_in_process_and_across_processes(make_store):
    store = make_store()
    with pytest.raises(StoreLockedError, match="another streamfilter process"):
        make_store()
    opening = make_store.child_code.replace("\n", "\n    ")
    code = (
        "import sys\nfrom streamfilter.errors import StoreLockedError\n"
        f"try:\n    {opening}\nexcept StoreLockedError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "in use" in proc.stdout
    store.close()


def test_upkeep_never_changes_what_the_store_returns(make_store):
    """``compact`` (the daemon's upkeep between batches) leaves loads and lookups as they were,
    refuses a negative amount and reports the work left, which full upkeep brings to 0."""
    store = make_store()
    store.commit_day(commit("2026-01-01", ["a", "b"], [5, 7], [("q1", b"x")]))
    store.commit_day(commit("2026-01-02", ["a", "c"], [9, 1], []))
    expected = sorted(store.load().budgets)
    assert expected == [("a", 9, False), ("b", 7, False), ("c", 1, False)]
    with pytest.raises(ValueError):
        store.compact(-1)
    assert store.compact(1) >= 0
    assert sorted(store.load().budgets) == expected
    assert store.compact(10**9) == 0
    assert sorted(store.load().budgets) == expected
    assert [store.spent_units(u) for u in "abcd"] == [(9, False), (7, False), (1, False), None]


def test_sqlite_settings(tmp_path):
    store = SQLiteStateStore(tmp_path / "s.db")
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    store.close()


def test_corrupted_database_fails_closed(tmp_path):
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError):
        SQLiteStateStore(path)


# ---------------------------------------------------------------------------- the budget log
# A day's budget changes are one packed row of ``budget_log``, appended by the day's commit; the
# entries by which the log exceeds both ``budget_log_max_rows`` and the ``budgets`` table are
# folded into it, oldest first, by ``compact`` (the daemon's upkeep between batches).

ids = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12
) | st.sampled_from(["u-1", "u-10", "u-1x", "é", "ü-1", "u"])
days = st.lists(
    st.dictionaries(ids, st.tuples(st.integers(0, 2**62), st.booleans()), max_size=12),
    min_size=1,
    max_size=8,
)


def budget_commit(day_index: int, changes: dict[str, tuple[int, bool]]) -> DayCommit:
    return DayCommit(
        day=f"2026-01-{day_index + 1:02d}",
        releases=[],
        changed_users=np.array(list(changes), dtype=object),
        spent_units=np.array([s for s, _ in changes.values()], dtype=np.int64),
        retired=np.array([r for _, r in changes.values()], dtype=bool),
        positions={},
    )


def log_and_table_rows(store: SQLiteStateStore) -> tuple[int, int]:
    """(log entries not yet folded, rows of the table)"""
    log = store._db.execute("SELECT COALESCE(SUM(n_users), 0) FROM budget_log").fetchone()[0]
    log -= store._folded_entries()
    table = store._db.execute("SELECT count(*) FROM budgets").fetchone()[0]
    return log, table


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    history=days,
    fold_after=st.sampled_from([0, 3, 10, 10**6]),
    steps=st.lists(st.sampled_from([0, 1, 2, 5, 10**9]), min_size=8, max_size=8),
)
def test_budget_log_and_folding_keep_every_users_newest_state(
    tmp_path_factory, history, fold_after, steps
):
    """Whatever the fold threshold and however much upkeep runs between the days, the store
    loads, looks up (writer and lock-free reader) and survives reopening with exactly the newest
    state of every user — a plain dict model."""
    path = tmp_path_factory.mktemp("log") / "state.db"
    model: dict[str, tuple[int, bool]] = {}
    store = SQLiteStateStore(path, budget_log_max_rows=fold_after)
    try:
        for i, changes in enumerate(history):
            before = log_and_table_rows(store)
            store.commit_day(budget_commit(i, changes))
            model.update(changes)
            assert log_and_table_rows(store) == (before[0] + len(changes), before[1])  # appended
            excess, (log, _) = store.excess_log_entries(), log_and_table_rows(store)
            left = store.compact(steps[i])
            folded = min(excess, steps[i])  # oldest first; a table row per new user
            assert log_and_table_rows(store)[0] == log - folded
            assert left == store.excess_log_entries() <= excess - folded
            assert sorted(store.load().budgets) == sorted((u, s, r) for u, (s, r) in model.items())
        assert store.compact(10**9) == 0
        log, table = log_and_table_rows(store)
        assert log <= max(fold_after, table)  # folded once it outgrew both
        assert sorted(store.load().budgets) == sorted((u, s, r) for u, (s, r) in model.items())
        for user, state in model.items():
            assert store.spent_units(user) == state
        assert store.spent_units("never-charged") is None
    finally:
        store.close()
    with SQLiteStateReader(path) as reader:
        for user, state in model.items():
            assert reader.spent_units(user) == state
    again = SQLiteStateStore(path, budget_log_max_rows=fold_after)
    try:
        assert sorted(again.load().budgets) == sorted((u, s, r) for u, (s, r) in model.items())
    finally:
        again.close()


def test_budget_log_folds_its_oldest_entries_beyond_the_threshold_and_the_table(tmp_path):
    """Only the excess is folded, oldest first, a log row in part if need be; a day's commit
    only appends (its cost scales with the users changed that day)."""
    store = SQLiteStateStore(tmp_path / "state.db", budget_log_max_rows=4)

    def commit_and_compact(day: int, changes: dict[str, tuple[int, bool]]) -> None:
        before = log_and_table_rows(store)
        store.commit_day(budget_commit(day, changes))
        assert log_and_table_rows(store) == (before[0] + len(changes), before[1])
        assert store.compact(10**9) == 0
        assert store._oldest_row is None  # caught up: no log row is kept in memory

    try:
        commit_and_compact(0, {"a": (1, False), "b": (1, False), "c": (1, False)})
        assert log_and_table_rows(store) == (3, 0)  # 3 <= 4: stays in the log
        commit_and_compact(1, {"a": (2, False), "d": (2, True)})
        assert log_and_table_rows(store) == (4, 1)  # 5 > max(4, 0): a's oldest entry folded
        assert store._db.execute("SELECT count(*) FROM budget_log").fetchone()[0] == 2
        assert store.spent_units("a") == (2, False)  # the log's newer entry wins
        commit_and_compact(2, {"a": (3, False), "e": (3, False)})
        assert log_and_table_rows(store) == (4, 3)  # b and c: day 0's row is gone
        commit_and_compact(3, {"a": (4, True), "f": (4, False)})
        assert log_and_table_rows(store) == (4, 4)  # day 1's a and d
        commit_and_compact(4, {"g": (5, False)})
        assert log_and_table_rows(store) == (4, 4)  # day 2's a: upserted, not a new row
        assert store.spent_units("a") == (4, True) and store.spent_units("d") == (2, True)
        assert sorted(store.load().budgets) == [
            ("a", 4, True), ("b", 1, False), ("c", 1, False), ("d", 2, True),
            ("e", 3, False), ("f", 4, False), ("g", 5, False),
        ]  # fmt: skip
    finally:
        store.close()


def test_a_failed_commit_leaves_the_budget_log_and_its_counters_unchanged(tmp_path):
    store = SQLiteStateStore(tmp_path / "state.db", budget_log_max_rows=2)
    try:
        store.commit_day(commit("2026-01-01", ["a", "b"], [5, 7], [("q1", b"x")]))
        with pytest.raises(StoreError):  # the same (day, query) twice: refused
            store.commit_day(commit("2026-01-01", ["c", "d", "e"], [1, 1, 1], [("q1", b"y")]))
        assert log_and_table_rows(store) == (2, 0)
        store.commit_day(commit("2026-01-02", ["a"], [6], []))
        assert store.compact(10**9) == 0
        assert log_and_table_rows(store) == (2, 1)  # 3 > 2: counted from the committed days
        assert sorted(store.load().budgets) == [("a", 6, False), ("b", 7, False)]
    finally:
        store.close()


def behind_the_store(path, sql, args=()):
    """Run one statement on the state file directly (not via the store); its first row."""
    con = sqlite3.connect(path)
    try:
        row = con.execute(sql, args).fetchone()
        con.commit()
        return row
    finally:
        con.close()


def test_a_damaged_budget_log_row_is_refused(tmp_path):
    path = tmp_path / "state.db"
    store = SQLiteStateStore(path)
    store.commit_day(commit("2026-01-01", ["a", "b"], [5, 7], []))
    store.close()
    spent = behind_the_store(path, "SELECT spent_units FROM budget_log")[0]
    damaged = bytes([spent[0] ^ 1]) + spent[1:]  # a's spent units: 5 -> 4
    behind_the_store(path, "UPDATE budget_log SET spent_units = ?", (damaged,))
    store = SQLiteStateStore(path, budget_log_max_rows=0)
    try:
        with pytest.raises(StoreError, match="table budget_log does not match its checksum"):
            store.load()
        for read in (lambda: store.spent_units("a"), lambda: store.compact(10)):
            with pytest.raises(StoreError, match="table budget_log"):
                read()
        assert store._db.execute("SELECT count(*) FROM budgets").fetchone()[0] == 0
    finally:
        store.close()


def test_a_log_row_whose_columns_do_not_fit_together_is_refused_even_with_a_matching_crc(
    tmp_path,
):
    """Only a bug could write it (the CRC matches): still refused, never half-read."""
    path = tmp_path / "state.db"
    store = SQLiteStateStore(path)
    store.commit_day(commit("2026-01-01", ["a", "b"], [5, 7], []))
    store.close()
    seq, n, lengths, ids, spent, retired = behind_the_store(
        path, "SELECT seq, n_users, id_lengths, ids, spent_units, retired FROM budget_log"
    )
    short = spent[:8]  # one user's spent units for two users
    behind_the_store(
        path,
        "UPDATE budget_log SET spent_units = ?, crc = ?",
        (short, row_crc(seq, n, lengths, ids, short, retired)),
    )
    store = SQLiteStateStore(path, budget_log_max_rows=0)
    try:
        for read in (store.load, lambda: store.spent_units("a"), lambda: store.compact(10)):
            with pytest.raises(StoreError, match="table budget_log"):
                read()
    finally:
        store.close()


def test_telemetry_charges_are_admitted_only_within_the_pinned_total(make_store):
    from streamfilter.runtime.store import TelemetryBudgetError, TelemetryCharge

    store = make_store()
    first = store.charge_telemetry(TelemetryCharge("budget_stats", 0.25, b"r1"), 0.5)
    assert (first.spent, first.remaining) == (0.25, 0.25)
    with pytest.raises(TelemetryBudgetError, match="telemetry budget exceeded"):
        store.charge_telemetry(TelemetryCharge("budget_stats", 0.3, b"r2"), 0.5)
    with pytest.raises(TelemetryBudgetError, match="differs"):
        store.charge_telemetry(TelemetryCharge("budget_stats", 0.1, b"r3"), 0.75)
    with pytest.raises(TelemetryBudgetError, match="must be > 0"):
        store.charge_telemetry(TelemetryCharge("budget_stats", 0.0, b"r4"), 0.5)
    last = store.charge_telemetry(
        TelemetryCharge("active_set", 0.25, b"r5"), 0.5, active_set_state=b'{"t": 1}'
    )
    assert last.remaining == 0.0
    assert [(c.kind, c.rho, c.record) for c in store.telemetry_ledger()] == [
        ("budget_stats", 0.25, b"r1"),
        ("active_set", 0.25, b"r5"),
    ]
    assert store.load().active_set_state == b'{"t": 1}'
