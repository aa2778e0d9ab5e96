"""``state_commit_1m`` and ``state_commit_stall_1m``: SQLite commits of closed days.

``state_commit_1m``: the durable cost of one day in which all ``n`` users' budgets changed. The
state (``SQLiteStateStore``: WAL, ``synchronous=FULL``, ``budget_log_max_rows = n``) already
holds the ``n`` users (two untimed days); each timed run commits a new day through the public
``StateStore.commit_day`` with every user's budget changed, 4 releases and 3 input positions
(one transaction, fsync'd before it returns), then runs the store's upkeep
(``StateStore.compact``) until nothing is left to fold: the log holds ``n`` entries more than
the table allows, so the upkeep folds the ``n`` oldest log entries into the table (upserts).
``value`` is the median of commit + upkeep — all the work the day's budget changes cost, even
though the daemon only waits for the commit (the upkeep runs between later input batches); the
detail gives the commit alone.

``state_commit_stall_1m``: the *worst* single call ingest waits for, over 8 days (4 in
``--quick``) on which a random quarter of the ``n`` users change, listed in random order as the
engine's hash order lists them, with ``budget_log_max_rows = n`` (the default at 1 M): each day's
commit, and each upkeep call the daemon makes after an input batch
(``compact(batch records)``, the default batch being 50,000 records) until the day's entries
are folded (a bounded stall is the point: once every fifth such day folded 1.25 M log entries inside one
commit: 5.09 s at 1 M users on this machine; later each commit folded what it appended).

Baseline — the lower bound for writing the day's rows through Python's ``sqlite3``: the same
``(user_id, spent_units, retired)`` rows, built from the same numpy arrays, bulk-inserted with
one ``executemany`` into an *empty* ``WITHOUT ROWID`` table of the same shape (sorted keys, no
conflicts), same pragmas, one transaction. ``commit_day`` + upkeep update existing rows and
write more (per-row integrity checks, the releases, positions and sequence), so ratio = lower
bound ÷ value is at most about 1: it says how close the day's budget writes are to that floor.

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
#: records per input batch (the daemon's default ``batch_size``): the upkeep's step after one
UPKEEP_STEP_ENTRIES = 50_000


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


def _upkeep_calls(store: SQLiteStateStore) -> list[float]:
    """Seconds of each ``compact`` call the daemon would make, one per input batch, until the
    log is within bounds."""
    seconds = []
    while store.excess_log_entries():
        t0 = time.perf_counter()
        store.compact(UPKEEP_STEP_ENTRIES)
        seconds.append(time.perf_counter() - t0)
    return seconds


def _stall(n: int, changed: int, days: int) -> tuple[list[float], list[float], list[float]]:
    """Commit times of ``days`` days, each changing ``changed`` random users of the ``n`` already
    in the table (``budget_log_max_rows = n``), each upkeep call's, and each day's bulk-insert
    floor."""
    users = _users(n)
    rng = np.random.default_rng(1)
    commits, upkeep, floors = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = SQLiteStateStore(work / "state.db", budget_log_max_rows=n)
        try:
            spent = rng.integers(1, 1000, n).astype(np.int64)
            for d in range(2):  # the users exist, in the table: untimed
                spent = spent + 1
                store.commit_day(_commit(f"2026-01-0{d + 1}", users, spent, d * 1000))
                store.compact(10 * n)
            store.close()
            store = SQLiteStateStore(work / "state.db", budget_log_max_rows=n)
            for r in range(days):
                pick = rng.choice(n, changed, replace=False)  # the engine's order: by hash
                spent[pick] += rng.integers(1, 1000, changed)
                day = f"2026-02-{r + 1:02d}"
                t0 = time.perf_counter()
                store.commit_day(_commit(day, users[pick], spent[pick], (r + 2) * 1000))
                commits.append(time.perf_counter() - t0)
                upkeep += _upkeep_calls(store)
                floors.append(_lower_bound(work / f"floor-{r}.db", users[pick], spent[pick]))
            assert store.spent_units(str(users[pick[-1]])) == (int(spent[pick[-1]]), False)
        finally:
            store.close()
    return commits, upkeep, floors


def run(quick: bool = False) -> list[dict[str, object]]:
    n = 50_000 if quick else 1_000_000
    runs = 3 if quick else 5
    users = _users(n)
    rng = np.random.default_rng(0)
    commits, totals, floors = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = SQLiteStateStore(work / "state.db", budget_log_max_rows=n)
        try:
            spent = rng.integers(1, 1000, n).astype(np.int64)
            for d in range(2):  # the users exist, in the table: untimed
                spent = spent + d
                store.commit_day(_commit(f"2026-01-0{d + 1}", users, spent, d * 1000))
                store.compact(10 * n)
            for r in range(runs):  # paired with the floor, the order alternating
                spent = spent + rng.integers(1, 1000, n)
                day = f"2026-01-{r + 3:02d}"
                if r % 2:
                    floors.append(_lower_bound(work / f"floor-{r}.db", users, spent))
                t0 = time.perf_counter()
                store.commit_day(_commit(day, users, spent, (r + 2) * 1000))
                commits.append(time.perf_counter() - t0)
                assert store.compact(10 * n) == 0
                totals.append(time.perf_counter() - t0)
                if r % 2 == 0:
                    floors.append(_lower_bound(work / f"floor-{r}.db", users, spent))
            assert store.spent_units(str(users[-1])) == (int(spent[-1]), False)
        finally:
            store.close()
        naive = _naive_rows_per_s(work / "naive.db", users)
    value, base = statistics.median(totals), statistics.median(floors)
    changed = n // 4
    days = 4 if quick else 8
    stalls, upkeep, stall_floors = _stall(n, changed, days)
    worst = max(stalls + upkeep)
    size = f"{n // 1000}k" if quick else "1m"
    return [
        entry(
            f"state_commit_{size}",
            value=round(value, 3),
            unit="s",
            baseline="sqlite3 bulk-insert lower bound (same rows, empty table, one transaction)",
            baseline_value=round(base, 3),
            ratio=round(statistics.median(f / t for f, t in zip(floors, totals, strict=True)), 2),
            ratio_definition="median over paired runs of baseline ÷ value; 1 = at the floor",
            runs=runs,
            size=f"{n:,} changed users per day",
            detail=(
                f"SQLiteStateStore.commit_day of one day, {n:,} budgets updated + 4 releases + "
                f"3 positions, WAL + synchronous=FULL, fsync'd, then the upkeep folding the "
                f"{n:,} oldest log entries into the table: {value / n * 1e6:.2f} µs per user "
                f"(median of {runs} days); the commit alone, all the day's close waits for: "
                f"{statistics.median(commits):.3f} s. "
                f"Naive per-row upserts in autocommit (one durable transaction each): "
                f"{naive:,.0f} rows/s on a {NAIVE_SAMPLE}-row sample, i.e. ~{n / naive:,.0f} s "
                f"for {n:,} (extrapolated, {n / naive / value:,.0f}× the commit)"
            ),
        ),
        entry(
            f"state_commit_stall_{size}",
            value=round(worst, 3),
            unit="s",
            baseline="sqlite3 bulk-insert lower bound of the day's rows (median)",
            baseline_value=round(statistics.median(stall_floors), 3),
            ratio=round(statistics.median(stall_floors) / worst, 2),
            ratio_definition="baseline ÷ worst call; 1 = at the floor",
            runs=len(stalls),
            size=f"{changed:,} of {n:,} users changed per day, {days} days",
            detail=(
                f"the worst call of {days} consecutive days (budget_log_max_rows = {n:,}, the log "
                f"full: each day's entries are folded by the upkeep after it): commits (s) "
                f"{', '.join(f'{t:.2f}' for t in stalls)}; {len(upkeep)} upkeep calls of "
                f"{UPKEEP_STEP_ENTRIES:,} entries, median {statistics.median(upkeep):.2f} s, "
                f"worst {max(upkeep):.2f} s"
            ),
        ),
    ]


if __name__ == "__main__":
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
