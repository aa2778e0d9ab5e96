"""``open_day_memory``: peak RSS of one open day as its events grow, for the same users.

The same ``n_users`` users send ``k`` events each in one day (``k`` = 1, then 10), each event
with ``active`` (1), ``minutes`` (a float) and ``plan`` (one of 3 categories), through the
daemon's path: batches of 50,000 lines decoded as columns by ``engine.ingest.parse_columns`` and
added with ``DayAccumulator.add_columns`` (a batch of several schemas: ``parse_events`` and
``add_many``); then the day's records are built (``finish``). Each size runs in
its own process (``--child``), which reports its peak RSS (``VmHWM``) and the seconds spent.

value = peak RSS at ``10·n`` events, baseline = at ``n`` events; ratio = value ÷ baseline (target,
issue #17: ≤ 1.2, i.e.
memory bounded by the (user, coordinate) cells, not by the events). Reported beside it: the
bytes per event the open day holds, and the same ratio with categorical values only (which the
accumulator folds into per-cell counts as they arrive).
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
            values: dict[str, object] = {"plan": plans[(u + rep) % 3]}
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


def _child(n_users: int, k: int, numeric: bool) -> None:
    from streamfilter.engine.ingest import parse_columns, parse_events
    from streamfilter.engine.records import DayAccumulator

    acc = DayAccumulator("2026-03-01")
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


def _measure(n_users: int, k: int, numeric: bool) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_memory", "--child", str(n_users), str(k)]
        + (["--numeric"] if numeric else []),
        cwd=Path(__file__).resolve().parent.parent,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run(quick: bool = False, n_users: int | None = None) -> list[dict[str, object]]:
    n = n_users or (5_000 if quick else 1_000_000)
    one, ten = _measure(n, 1, True), _measure(n, 10, True)
    cat_one, cat_ten = _measure(n, 1, False), _measure(n, 10, False)
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
                f"events with a category and two numbers: peak RSS {one['peak_rss_mib']:.0f} → "
                f"{ten['peak_rss_mib']:.0f} MiB, the open day grows {per_event:.0f} B per extra "
                f"event (numbers folded into exact per-cell sums as they arrive; what grows is "
                f"the repeated-event index); ingest {one['ingest_s']:.1f} / {ten['ingest_s']:.1f} s, "
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
        _child(int(sys.argv[2]), int(sys.argv[3]), "--numeric" in sys.argv)
    else:
        users = int(sys.argv[sys.argv.index("--users") + 1]) if "--users" in sys.argv else None
        print(json.dumps(run(quick="--quick" in sys.argv, n_users=users), indent=2))
