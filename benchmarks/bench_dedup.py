"""``dedup_index_vs_sqlite``: the day's event-id index against an SQLite table.

The operation a user waits for: a day's ``(user, event_id)`` pairs arrive in the daemon's
batches (``batch_size`` = 50,000 records) and each batch must learn which of its events are new
— neither seen earlier that day nor earlier in the batch (docs/design.md §2.2). The input is
``n`` events over ``n // 10`` users, ids like the other benchmarks' (``e{user}-{j}``), of which
5% repeat an earlier event (a redelivery), shuffled; every arm gets the same events in the same
order (one seed) and must mark exactly the same events new (asserted, bit for bit).

Arms, each in its own child process. Peak RSS is that process's ``VmHWM``, reset once the input
is built (its temporaries freed), so it is the input every arm holds alike plus the arm's own
peak; the detail also gives the growth past the input alone:

- ``spill``: the index the daemon builds (``runtime/app.py``): ``SpillingEventIds`` with its
  default memory budget (``event_ids_in_memory`` = 2**20 pairs), spilling to a temporary
  directory past it. ``value`` is its events/s.
- ``memory``: the in-memory tier alone (``new_seen_event_ids``: the native pair set).
- ``sqlite`` (baseline): what a user would write instead — a ``(user, event_id)`` table with
  ``PRIMARY KEY (user, event_id) WITHOUT ROWID`` in a file in the same temporary directory
  (``journal_mode=OFF``, ``synchronous=OFF``: the index is rebuilt from the input after a crash,
  as the project's is, so neither arm pays for durability), a 64 MiB page cache (about the
  index's memory budget), one transaction per batch. Python's ``executemany`` returns no
  ``RETURNING`` rows, so each batch is staged in a temporary table (``executemany``) and moved
  with one ``INSERT ... SELECT ... ORDER BY user, event_id, seq ON CONFLICT DO NOTHING RETURNING
  seq``: of equal pairs the earliest is inserted and later ones refused, and the returned
  positions are the new events. In a 1 M-event trial this beat the same staging in arrival order
  (and the default 2 MiB cache) by ~25% and a per-row ``INSERT`` + ``rowcount`` loop by ~20%.
- ``pyset``: a Python ``set`` of ``(user, event_id)`` tuples — the in-memory alternative a user
  would write first (unbounded memory: not a substitute for the spilling tier).

Rounds rotate the arms' order (pair ``i`` starts at ``ARMS[i % 4]``), ≥ 5 rounds (``--quick``:
1 round, 20,000 events). ratio = index events/s ÷ SQLite events/s, the median of per-round
ratios; the in-memory tier's and the set's ratios are in the detail.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import entry

NAME = "dedup_index_vs_sqlite"
BASELINE = "SQLite WITHOUT ROWID table, one transaction per batch"
#: records per input batch (the daemon's default ``batch_size``)
BATCH_EVENTS = 50_000
REPEATED_FRACTION = 0.05
#: SQLite's page cache (KiB): about the spilling index's in-memory budget (2**20 pairs at ~24 B
#: plus the id, with the hash set's slack), not SQLite's 2 MiB default, which is slower
SQLITE_CACHE_KIB = 64 * 1024
ARMS = ("spill", "memory", "sqlite", "pyset")


def events(n: int, seed: int = 7) -> tuple[np.ndarray, list[str]]:
    """``n`` events (int32 user codes, ids) of which ``REPEATED_FRACTION`` repeat an earlier
    one, shuffled; the same for every arm (``seed``)."""
    rng = random.Random(seed)
    n_users = max(1, n // 10)
    n_unique = n - int(n * REPEATED_FRACTION)
    users = [rng.randrange(n_users) for _ in range(n_unique)]
    ids = [f"e{u}-{j}" for j, u in enumerate(users)]
    order = list(range(n_unique)) + [rng.randrange(n_unique) for _ in range(n - n_unique)]
    rng.shuffle(order)
    return np.array([users[k] for k in order], dtype=np.int32), [ids[k] for k in order]


def _status_mib(field: str) -> float:
    """``VmRSS`` or ``VmHWM`` (the peak since the last reset) of this process, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak_rss() -> None:
    """Start the peak RSS (``VmHWM``) over from the current RSS (Linux ``clear_refs`` 5), so the
    input's building, whose temporaries are freed by now, is not in the arm's peak."""
    Path("/proc/self/clear_refs").write_text("5")


def _index_arm(arm: str, users: np.ndarray, ids: list[str], tmp: str) -> np.ndarray:
    from streamfilter.dedup.in_memory import new_seen_event_ids
    from streamfilter.dedup.spill import DEFAULT_MEMORY_PAIRS, SpillingEventIds

    index = SpillingEventIds(DEFAULT_MEMORY_PAIRS, tmp) if arm == "spill" else new_seen_event_ids()
    new = np.empty(len(ids), dtype=bool)
    try:
        for a in range(0, len(ids), BATCH_EVENTS):
            b = a + BATCH_EVENTS
            new[a:b] = index.insert(users[a:b], ids[a:b])
    finally:
        index.close()
    return new


def _sqlite_arm(users: np.ndarray, ids: list[str], tmp: str) -> np.ndarray:
    db = sqlite3.connect(Path(tmp) / "seen.db", isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=OFF")
        db.execute("PRAGMA synchronous=OFF")
        db.execute("PRAGMA temp_store=MEMORY")
        db.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")
        db.execute(
            "CREATE TABLE seen (user INTEGER NOT NULL, event_id TEXT NOT NULL, seq INTEGER NOT "
            "NULL, PRIMARY KEY (user, event_id)) WITHOUT ROWID"
        )
        db.execute("CREATE TEMP TABLE batch (seq INTEGER PRIMARY KEY, user INTEGER, event_id TEXT)")
        new = np.zeros(len(ids), dtype=bool)
        for a in range(0, len(ids), BATCH_EVENTS):
            b = min(a + BATCH_EVENTS, len(ids))
            db.execute("BEGIN")
            db.executemany(
                "INSERT INTO batch VALUES (?, ?, ?)",
                zip(range(a, b), users[a:b].tolist(), ids[a:b], strict=True),
            )
            seqs = db.execute(
                "INSERT INTO seen SELECT user, event_id, seq FROM batch WHERE true "
                "ORDER BY user, event_id, seq ON CONFLICT DO NOTHING RETURNING seq"
            ).fetchall()
            db.execute("DELETE FROM batch")
            db.execute("COMMIT")
            new[np.fromiter((s for (s,) in seqs), np.int64, count=len(seqs))] = True
        return new
    finally:
        db.close()


def _pyset_arm(users: np.ndarray, ids: list[str]) -> np.ndarray:
    seen: set[tuple[int, str]] = set()
    add = seen.add  # returns None: ``not add(p)`` adds and is True
    new = np.empty(len(ids), dtype=bool)
    user_list = users.tolist()
    for a in range(0, len(ids), BATCH_EVENTS):
        b = a + BATCH_EVENTS
        pairs = zip(user_list[a:b], ids[a:b], strict=True)
        new[a:b] = [p not in seen and not add(p) for p in pairs]
    return new


def _child(arm: str, n: int, out: str) -> None:
    """One arm on ``n`` events: print its seconds, peak RSS and RSS growth (MiB) as JSON and
    write which events were new to ``out`` (packed bits)."""
    users, ids = events(n)
    gc.collect()
    _reset_peak_rss()
    before_mib = _status_mib("VmRSS")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        if arm == "sqlite":
            new = _sqlite_arm(users, ids, tmp)
        elif arm == "pyset":
            new = _pyset_arm(users, ids)
        else:
            new = _index_arm(arm, users, ids, tmp)
        seconds = time.perf_counter() - t0
    peak_mib = _status_mib("VmHWM")
    Path(out).write_bytes(np.packbits(new).tobytes())
    result = {"seconds": seconds, "peak_rss_mib": peak_mib, "rss_growth_mib": peak_mib - before_mib}
    print(json.dumps(result))


def _arm(arm: str, n: int, out: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_dedup", "--child", arm, str(n), str(out)],
        cwd=Path(__file__).resolve().parent.parent,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(n: int, runs: int) -> dict[str, Any]:
    """``runs`` order-rotated rounds of the three arms on ``n`` events; asserts they agree."""
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            order = ARMS[i % len(ARMS) :] + ARMS[: i % len(ARMS)]
            rounds.append({arm: _arm(arm, n, Path(tmp) / f"{arm}{i}.bits") for arm in order})
            masks = {arm: (Path(tmp) / f"{arm}{i}.bits").read_bytes() for arm in ARMS}
            assert masks["spill"] == masks["sqlite"], "spill and SQLite disagree on new events"
            assert masks["memory"] == masks["sqlite"], "in-memory and SQLite disagree"
            assert masks["pyset"] == masks["sqlite"], "Python set and SQLite disagree"
        new_events = int(np.unpackbits(np.frombuffer(masks["sqlite"], np.uint8))[:n].sum())
    assert new_events == n - int(n * REPEATED_FRACTION), new_events

    def med(arm: str, key: str) -> float:
        return statistics.median(r[arm][key] for r in rounds)

    return {
        "n": n,
        "runs": runs,
        "new_events": new_events,
        "events_per_s": {a: n / med(a, "seconds") for a in ARMS},
        "ratio": statistics.median(r["sqlite"]["seconds"] / r["spill"]["seconds"] for r in rounds),
        "memory_ratio": statistics.median(
            r["sqlite"]["seconds"] / r["memory"]["seconds"] for r in rounds
        ),
        "pyset_ratio": statistics.median(
            r["pyset"]["seconds"] / r["spill"]["seconds"] for r in rounds
        ),
        "peak_rss_mib": {a: med(a, "peak_rss_mib") for a in ARMS},
        "rss_growth_mib": {a: med(a, "rss_growth_mib") for a in ARMS},
        "load_1min": os.getloadavg()[0],
    }


def run(quick: bool = False, sizes: list[int] | None = None, runs: int | None = None) -> list:
    sizes = sizes or ([20_000] if quick else [1_000_000, 5_000_000])
    runs = runs or (1 if quick else 5)
    out = []
    for n in sizes:
        m = measure(n, runs)
        eps, rss, grow = m["events_per_s"], m["peak_rss_mib"], m["rss_growth_mib"]
        out.append(
            entry(
                f"{NAME}_{n // 1000}k" if n < 1_000_000 else f"{NAME}_{n // 1_000_000}m",
                value=round(eps["spill"]),
                unit="events/s",
                baseline=BASELINE,
                baseline_value=round(eps["sqlite"]),
                ratio=round(m["ratio"], 2),
                ratio_definition="index events/s ÷ SQLite events/s, median of rounds",
                runs=runs,
                size=f"{n:,} events, 5% repeated, batches of {BATCH_EVENTS:,}",
                detail=(
                    f"events/s: spilling index {eps['spill']:,.0f}, in-memory tier "
                    f"{eps['memory']:,.0f} (ratio {m['memory_ratio']:.2f}), SQLite "
                    f"{eps['sqlite']:,.0f}, Python set {eps['pyset']:,.0f} (index ÷ set "
                    f"{m['pyset_ratio']:.2f}); peak RSS MiB spill {rss['spill']:.0f} / memory "
                    f"{rss['memory']:.0f} / SQLite {rss['sqlite']:.0f} / set {rss['pyset']:.0f} "
                    f"(growth past the input {grow['spill']:.0f} / {grow['memory']:.0f} / "
                    f"{grow['sqlite']:.0f} / {grow['pyset']:.0f}); all "
                    f"arms marked the same {m['new_events']:,} events new; "
                    f"load {m['load_1min']:.1f}"
                ),
                memory_ratio=round(m["memory_ratio"], 2),
                pyset_ratio=round(m["pyset_ratio"], 2),
                peak_rss_mib=rss,
                rss_growth_mib=grow,
                events_per_s={a: round(v) for a, v in eps.items()},
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", type=int, nargs="*", help="events per day, e.g. 1000000")
    parser.add_argument("--runs", type=int, help="pairs (rounds of all arms); default 5")
    parser.add_argument("--child", nargs=3, metavar=("ARM", "N", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]), args.child[2])
        return
    for e in run(quick=args.quick, sizes=args.sizes, runs=args.runs):
        print(json.dumps(e))


if __name__ == "__main__":
    main()
