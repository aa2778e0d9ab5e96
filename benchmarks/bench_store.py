"""``state_commit_1m``: the SQLite commit of one closed day in which ``n`` users' budgets changed.

The state (``SQLiteStateStore``: WAL, ``synchronous=FULL``, ``budget_log_max_rows = n``) already
holds the ``n`` users in its budgets table (two untimed days inserted them: the second folded
the log); each timed run commits a new day through the public ``StateStore.commit_day`` with
every user's budget changed, 4 releases and 3 input positions, i.e. one transaction, made durable
(fsync) before it returns. With every user changing every day, the budget log outgrows the table
every second day, so the days alternate between an append (one packed log row) and an append
plus a fold (two days of changes upserted into the table, each user once). A run is one such
pair of days; ``value`` is the median over the runs of the pair's mean — the amortised cost per
day — and the detail gives both kinds.

Baseline — the lower bound for writing ``n`` rows through Python's ``sqlite3``: the same ``n``
``(user_id, spent_units, retired)`` rows, built from the same numpy arrays, bulk-inserted with one
``executemany`` into an *empty* ``WITHOUT ROWID`` table of the same shape (sorted keys, no
conflicts), same pragmas, one transaction. ``commit_day`` updates existing rows and writes more
(per-row integrity checks, the releases, positions and sequence), so ratio = lower bound ÷ commit
is at most about 1: it says how close the commit is to that floor.

For scale, the detail also gives the naive way — per-row upserts in autocommit mode, one durable
transaction per row — measured on a small sample and extrapolated to ``n`` (it would take far too
long to run in full).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import entry
from streamfilter.runtime.store import DayCommit, Position, SQLiteStateStore

NAIVE_SAMPLE = 300


def _users(n: int) -> np.ndarray:
    return np.array([f"u-{i:08d}" for i in range(n)], dtype=object)


def _commit(day: str, users: np.ndarray, spent: np.ndarray, offset: int) -> DayCommit:
    release = json.dumps(
        {
            "day": day,
            "query_id": "q",
            "labels": ["a"],
            "value": [1234.5],
            "sigma": 3.2,
            "ci95": [6.2],
            "mechanism": "discrete_gaussian",
            "granularity": 2.0**-10,
        }
    ).encode()
    return DayCommit(
        day=day,
        releases=[(f"q{j}", release) for j in range(4)],
        changed_users=users,
        spent_units=spent,
        retired=np.zeros(len(users), dtype=bool),
        positions={f"events:{p}": Position(offset, offset) for p in range(3)},
    )


def _lower_bound(path: Path, users: np.ndarray, spent: np.ndarray) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute(
            "CREATE TABLE budgets (user_id TEXT PRIMARY KEY, spent_units INTEGER NOT NULL, "
            "retired INTEGER NOT NULL) WITHOUT ROWID"
        )
        retired = np.zeros(len(users), dtype=bool)
        t0 = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO budgets VALUES (?, ?, ?)",
            zip(users.tolist(), spent.tolist(), retired.astype(int).tolist(), strict=True),
        )
        db.execute("COMMIT")
        return time.perf_counter() - t0
    finally:
        db.close()


def _naive_rows_per_s(path: Path, users: np.ndarray) -> float:
    """Per-row upserts in autocommit mode (each row its own durable transaction)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute(
            "CREATE TABLE budgets (user_id TEXT PRIMARY KEY, spent_units INTEGER NOT NULL, "
            "retired INTEGER NOT NULL) WITHOUT ROWID"
        )
        sample = users[:NAIVE_SAMPLE].tolist()
        t0 = time.perf_counter()
        for u in sample:
            db.execute(
                "INSERT INTO budgets VALUES (?, ?, 0) ON CONFLICT(user_id) DO UPDATE SET "
                "spent_units = excluded.spent_units, retired = excluded.retired",
                (u, 1),
            )
        return len(sample) / (time.perf_counter() - t0)
    finally:
        db.close()


def _log_rows(store: SQLiteStateStore) -> int:
    return int(store._db.execute("SELECT COALESCE(SUM(n_users), 0) FROM budget_log").fetchone()[0])


def run(quick: bool = False) -> list[dict[str, object]]:
    n = 100_000 if quick else 1_000_000
    runs = 3 if quick else 5  # pairs of days: an append, then an append and a fold
    users = _users(n)
    rng = np.random.default_rng(0)
    appends, folds, floors = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = SQLiteStateStore(work / "state.db", budget_log_max_rows=n)
        try:
            spent = rng.integers(1, 1000, n).astype(np.int64)
            for d in range(2):  # the users exist, in the table: untimed
                spent = spent + d
                store.commit_day(_commit(f"2026-01-0{d + 1}", users, spent, d * 1000))
            assert _log_rows(store) == 0
            for r in range(2 * runs):
                spent = spent + rng.integers(1, 1000, n)
                day = f"2026-01-{r + 3:02d}"
                t0 = time.perf_counter()
                store.commit_day(_commit(day, users, spent, (r + 2) * 1000))
                (folds if _log_rows(store) == 0 else appends).append(time.perf_counter() - t0)
                if r % 2:
                    floors.append(_lower_bound(work / f"floor-{r}.db", users, spent))
            assert len(appends) == len(folds) == runs
            assert store.spent_units(str(users[-1])) == (int(spent[-1]), False)
        finally:
            store.close()
        naive = _naive_rows_per_s(work / "naive.db", users)
    pairs = [(a + f) / 2 for a, f in zip(appends, folds, strict=True)]
    value, base = statistics.median(pairs), statistics.median(floors)
    append, fold = statistics.median(appends), statistics.median(folds)
    return [
        entry(
            f"state_commit_{'100k' if quick else '1m'}",
            value=round(value, 3),
            unit="s",
            baseline="sqlite3 bulk-insert lower bound (same rows, empty table, one transaction)",
            baseline_value=round(base, 3),
            ratio=round(base / value, 2),
            ratio_definition="baseline ÷ value; 1 = at the floor",
            runs=runs,
            size=f"{n:,} changed users per day",
            append_s=round(append, 3),
            fold_s=round(fold, 3),
            detail=(
                f"SQLiteStateStore.commit_day of one day, {n:,} budgets updated + 4 releases + "
                f"3 positions, WAL + synchronous=FULL, fsync'd; per day, amortised over an appending "
                f"and a folding day (median of {runs} such pairs): {value / n * 1e6:.2f} µs per user: a day appended to the budget log takes "
                f"{append:.3f} s, a day whose commit also folds the log (2 days of changes, each "
                f"user upserted once) {fold:.3f} s (medians). "
                f"Naive per-row upserts in autocommit (one durable transaction each): "
                f"{naive:,.0f} rows/s on a {NAIVE_SAMPLE}-row sample, i.e. ~{n / naive:,.0f} s "
                f"for {n:,} (extrapolated, {n / naive / value:,.0f}× the commit)"
            ),
        )
    ]


if __name__ == "__main__":
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
