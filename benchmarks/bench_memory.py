"""``open_day_memory``: peak RSS of one open day as its events grow, for the same users.

The same ``n_users`` users send ``k`` events each in one day (``k`` = 1, then 10), each event
with ``active`` (1), ``minutes`` (a float) and ``plan`` (a user's one of 3 categories, so the
day's (user, coordinate) cells are the same for both sizes), an event id each, through the
daemon's path: batches of 50,000 lines decoded as columns by ``engine.ingest.parse_columns`` and
added with ``DayAccumulator.add_columns`` (a batch of several schemas: ``parse_events`` and
``add_many``) with the daemon's spilling event-id index (``--in-memory``: ``SeenEventIds``);
then the day's records are built (``finish``). Each size runs in its own process (``--child``),
which first sets the daemon's memory policy (``runtime.memory``, as ``streamfilter run`` does)
and reports its peak RSS (``VmHWM``) and the seconds spent.

value = peak RSS at ``10·n`` events, baseline = at ``n`` events; ratio = value ÷ baseline (target
≤ 1.2, i.e. memory bounded by the (user, coordinate) cells, not by the events). Reported beside it: the
bytes per event the open day holds, and the same ratio with categorical values only (which the
accumulator folds into per-cell counts as they arrive).

``event_id_index_memory`` (not in ``make bench``: minutes): the repeated-event index alone —
peak RSS and insert throughput of ``N`` distinct (user code, event id) pairs of ``n_users`` users
(ids ``e{u}-{r}``, round ``r`` of every user, batches of 50,000 as the daemon inserts them), in
memory (``in_memory.SeenEventIds``) and spilling to disk (``dedup.spill.SpillingEventIds``),
each size and kind in its own process: ``python -m benchmarks.bench_memory --event-ids
[--pairs 10000000,100000000] [--users 10000000]`` (``BENCH_SPILL_DIR`` picks the spill directory,
``BENCH_SPILL_PAIRS`` the pairs held in memory; default: the daemon's).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import entry

NAME = "open_day_memory"
BATCH = 50_000


def _lines(n_users: int, k: int, numeric: bool, seed: int = 0):
    rng = random.Random(seed)
    plans = ["free", "pro", "team"]
    batch = []
    for rep in range(k):
        for u in range(n_users):
            values: dict[str, object] = {"plan": plans[u % 3]}
            if numeric:
                values["active"] = 1
                values["minutes"] = round(rng.random() * 60, 2)
            batch.append(
                json.dumps(
                    {
                        "user_id": f"user-{u}",
                        "day": "2026-03-01",
                        "event_id": f"e{u}-{rep}",
                        "values": values,
                    }
                ).encode()
            )
            if len(batch) == BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def _vm(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _child(n_users: int, k: int, numeric: bool, spill: bool = False) -> None:
    from streamfilter.dedup.spill import SpillingEventIds
    from streamfilter.engine.ingest import parse_columns, parse_events
    from streamfilter.engine.records import DayAccumulator
    from streamfilter.runtime.memory import keep_freed_memory

    keep_freed_memory()  # what `streamfilter run` does first (its input never goes quiet here)

    # ``--spill``: the daemon's event-id index (spilling to disk), else the in-memory one
    index = SpillingEventIds(label="2026-03-01") if spill else None
    acc = DayAccumulator("2026-03-01", index)
    base = _vm("VmRSS")
    t0 = time.perf_counter()
    for batch in _lines(n_users, k, numeric):
        columns = parse_columns(batch)  # the daemon's path: columns, else events
        if columns is not None:
            acc.add_columns(columns)
        else:
            acc.add_many(parse_events(batch))  # type: ignore[arg-type]
    ingest_s = time.perf_counter() - t0
    open_mib = _vm("VmRSS") - base
    t1 = time.perf_counter()
    records = acc.finish()
    finish_s = time.perf_counter() - t1
    out = {
        "events": acc.events,
        "users": records.n_users,
        "open_day_mib": open_mib,
        "peak_rss_mib": _vm("VmHWM"),
        "ingest_s": ingest_s,
        "finish_s": finish_s,
    }
    print(json.dumps(out))


def _event_ids_child(kind: str, n_pairs: int, n_users: int) -> None:
    """Insert ``n_pairs`` pairs into an index of ``kind`` (``memory`` or ``spill``); print the
    peak RSS, the RSS before the first pair and the seconds spent inside ``insert``."""
    import numpy as np

    from streamfilter.dedup.in_memory import SeenEventIds
    from streamfilter.dedup.index import EventIdIndex
    from streamfilter.dedup.spill import DEFAULT_MEMORY_PAIRS, SpillingEventIds

    bound = int(os.environ.get("BENCH_SPILL_PAIRS", DEFAULT_MEMORY_PAIRS))
    index: EventIdIndex = (
        SeenEventIds()
        if kind == "memory"
        else SpillingEventIds(bound, os.environ.get("BENCH_SPILL_DIR"), label="bench")
    )
    base = _vm("VmRSS")
    insert_s = 0.0
    new = 0
    for start in range(0, n_pairs, BATCH):
        pos = np.arange(start, min(n_pairs, start + BATCH))
        users, rounds = pos % n_users, pos // n_users
        ids = [f"e{u}-{r}" for u, r in zip(users.tolist(), rounds.tolist(), strict=True)]
        codes = users.astype(np.int32)
        t0 = time.perf_counter()
        new += int(index.insert(codes, ids).sum())
        insert_s += time.perf_counter() - t0
    held, segments = len(index), getattr(index, "segment_count", 0)
    t0 = time.perf_counter()
    index.close()
    out = {
        "pairs": n_pairs,
        "new": new,
        "held": held,
        "segments": segments,
        "base_rss_mib": base,
        "peak_rss_mib": _vm("VmHWM"),
        "insert_s": insert_s,
        "close_s": time.perf_counter() - t0,
    }
    print(json.dumps(out))


def run_event_ids(pair_counts: list[int], n_users: int) -> list[dict[str, object]]:
    """Peak RSS and insert throughput of the repeated-event index, in memory and spilling."""
    measured = {}
    for n in pair_counts:
        for kind in ("memory", "spill"):
            argv = [sys.executable, "-m", "benchmarks.bench_memory", "--event-ids-child", kind]
            out = subprocess.run(
                [*argv, str(n), str(n_users)],
                cwd=Path(__file__).resolve().parent.parent,
                check=True,
                capture_output=True,
                text=True,
            )
            measured[kind, n] = json.loads(out.stdout.strip().splitlines()[-1])
            assert measured[kind, n]["new"] == measured[kind, n]["held"] == n
    small, big = min(pair_counts), max(pair_counts)
    entries = []
    for kind in ("memory", "spill"):
        lo, hi = measured[kind, small], measured[kind, big]
        ratio = hi["peak_rss_mib"] / lo["peak_rss_mib"]
        rates = ", ".join(
            f"{n:,} pairs: peak RSS {measured[kind, n]['peak_rss_mib']:,.0f} MiB "
            f"(before: {measured[kind, n]['base_rss_mib']:,.0f}), "
            f"{n / measured[kind, n]['insert_s'] / 1e6:.2f}M pairs/s, "
            f"{measured[kind, n]['segments']} segments"
            for n in pair_counts
        )
        entries.append(
            entry(
                f"event_id_index_memory_{kind}",
                value=round(hi["peak_rss_mib"]),
                unit="MiB peak RSS",
                baseline=f"the same index with {small:,} pairs",
                baseline_value=round(lo["peak_rss_mib"]),
                ratio=round(ratio, 2),
                ratio_definition=f"peak RSS at {big:,} ÷ at {small:,} pairs (lower is better)",
                target="≤ 1.2" if kind == "spill" else None,
                target_met=ratio <= 1.2 if kind == "spill" else None,
                runs=1,
                size=f"{n_users:,} users, ids e<user>-<round>, batches of {BATCH:,}",
                detail=f"{rates}; load average {os.getloadavg()[0]:.1f}",
            )
        )
    return entries


def _measure(n_users: int, k: int, numeric: bool, spill: bool = False) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_memory", "--child", str(n_users), str(k)]
        + (["--numeric"] if numeric else [])
        + (["--spill"] if spill else []),
        cwd=Path(__file__).resolve().parent.parent,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run(
    quick: bool = False, n_users: int | None = None, spill: bool = True
) -> list[dict[str, object]]:
    """``spill``: the open day's event ids go to the daemon's spilling index (the default; the
    in-memory one with ``--in-memory``)."""
    n = n_users or (5_000 if quick else 1_000_000)
    one, ten = _measure(n, 1, True, spill), _measure(n, 10, True, spill)
    cat_one, cat_ten = _measure(n, 1, False, spill), _measure(n, 10, False, spill)
    ratio = ten["peak_rss_mib"] / one["peak_rss_mib"]
    cat_ratio = cat_ten["peak_rss_mib"] / cat_one["peak_rss_mib"]
    per_event = (ten["open_day_mib"] - one["open_day_mib"]) * 2**20 / (9 * n)
    cat_per_event = (cat_ten["open_day_mib"] - cat_one["open_day_mib"]) * 2**20 / (9 * n)
    return [
        entry(
            NAME,
            value=round(ten["peak_rss_mib"]),
            unit="MiB peak RSS",
            baseline=f"the same {n:,} users with 1 event each",
            baseline_value=round(one["peak_rss_mib"]),
            ratio=round(ratio, 2),
            ratio_definition="peak RSS at 10 events/user ÷ at 1 event/user (lower is better)",
            target="≤ 1.2",
            target_met=ratio <= 1.2,
            runs=1,
            size=f"{n:,} users, {n:,} vs {10 * n:,} events of one day",
            detail=(
                f"event ids {'spilled to disk past 2^20 pairs' if spill else 'in memory'}; "
                f"events with a category and two numbers: peak RSS {one['peak_rss_mib']:.0f} → "
                f"{ten['peak_rss_mib']:.0f} MiB, the open day grows {per_event:.0f} B per extra "
                f"event (numbers folded into exact per-cell sums as they arrive); "
                f"ingest {one['ingest_s']:.1f} / {ten['ingest_s']:.1f} s, "
                f"records {one['finish_s']:.1f} / {ten['finish_s']:.1f} s. Category only (folded "
                f"into cell counts as they arrive): {cat_one['peak_rss_mib']:.0f} → "
                f"{cat_ten['peak_rss_mib']:.0f} MiB (×{cat_ratio:.2f}, {cat_per_event:.0f} B per "
                f"extra event); load average {os.getloadavg()[0]:.1f}"
            ),
            category_only_ratio=round(cat_ratio, 2),
            bytes_per_extra_event=round(per_event),
        )
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(int(sys.argv[2]), int(sys.argv[3]), "--numeric" in sys.argv, "--spill" in sys.argv)
    elif sys.argv[1:2] == ["--event-ids-child"]:
        _event_ids_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif "--event-ids" in sys.argv:
        arg = sys.argv[sys.argv.index("--pairs") + 1] if "--pairs" in sys.argv else None
        pairs = [int(p) for p in arg.split(",")] if arg else [10_000_000, 100_000_000]
        users = int(sys.argv[sys.argv.index("--users") + 1]) if "--users" in sys.argv else None
        print(json.dumps(run_event_ids(pairs, users or 10_000_000), indent=2))
    else:
        users = int(sys.argv[sys.argv.index("--users") + 1]) if "--users" in sys.argv else None
        spill = "--in-memory" not in sys.argv
        print(json.dumps(run("--quick" in sys.argv, users, spill), indent=2))
