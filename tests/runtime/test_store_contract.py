"""Contract suite for StateStore: every implementation runs these tests."""

import subprocess
import sys

import numpy as np
import pytest

from streamfilter.runtime.store import (
    DayCommit,
    Position,
    SQLiteStateStore,
    StoreError,
    StoreLockedError,
)


@pytest.fixture(params=["sqlite"])
def make_store(request, tmp_path):
    opened = []

    def factory():
        store = SQLiteStateStore(tmp_path / "state.db")
        opened.append(store)
        return store

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


def test_state_survives_reopen(make_store, tmp_path):
    store = make_store()
    store.commit_day(commit("2026-01-01", ["a"], [5], [("q1", b"x")]))
    store.close()
    again = make_store()
    assert again.load().budgets == [("a", 5, False)]


def test_second_writer_is_refused_in_process_and_across_processes(make_store, tmp_path):
    store = make_store()
    with pytest.raises(StoreLockedError, match="another streamfilter process"):
        SQLiteStateStore(tmp_path / "state.db")
    code = (
        "import sys\nfrom streamfilter.runtime.store import SQLiteStateStore, StoreLockedError\n"
        f"try:\n    SQLiteStateStore({str(tmp_path / 'state.db')!r})\nexcept StoreLockedError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "in use" in proc.stdout
    store.close()


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
