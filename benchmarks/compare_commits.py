"""Two checkouts of streamfilter side by side on ``bench_e2e``'s whole run against DuckDB:
``python -m benchmarks.compare_commits BEFORE AFTER [--pairs 6] [--users 1000000]``.

BEFORE and AFTER are checkouts (``git worktree add DIR COMMIT``), each with its own
``make .venv/.installed``. Every round runs three arms on the same stream — BEFORE's
``streamfilter run --until-end``, AFTER's, and DuckDB with one thread — in an order that changes
every round (rotated, and reversed every other round: over six rounds each arm goes first twice
and BEFORE runs before AFTER in three), and each streamfilter arm's
time is ``bench_e2e``'s: the run plus the fold of the budget-log entries it leaves, timed by that
checkout's own package. The method (stream, queries, configuration, DuckDB's SQL) is this
checkout's ``bench_e2e``, so both arms measure the same operation whatever their commits.

Prints, per round and as medians over the rounds: each arm's seconds, its ratio to the DuckDB run
of the same round, AFTER ÷ BEFORE, the same ratios of CPU seconds (the arm's processes' user +
system time, plus its fold: steadier than wall time on a shared machine), and the 1-minute load
average at the round's end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks import bench_e2e


def _python(checkout: Path) -> str:
    python = checkout / ".venv" / "bin" / "python"
    if not python.exists():
        sys.exit(f"{checkout}: no .venv (run `make .venv/.installed` there)")
    return str(python)


def compare(before: Path, after: Path, pairs: int, n_users: int) -> dict[str, object]:
    pythons = {"before": _python(before), "after": _python(after)}
    roots = {"before": before, "after": after}
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        n_events = bench_e2e.write_stream(work / "events.jsonl", n_users)
        order = ["before", "after", "duckdb"]
        for i in range(pairs):
            arms = order[i % 3 :] + order[: i % 3]
            if i % 2:
                arms.reverse()
            seconds: dict[str, float] = {}
            cpu: dict[str, float] = {}
            for arm in arms:
                if arm == "duckdb":
                    r = bench_e2e.duckdb_arm(work)
                    seconds[arm], cpu[arm] = r["seconds"], r["cpu_seconds"]
                else:
                    r = bench_e2e.streamfilter_arm(
                        work, work / f"{arm}{i}", pythons[arm], roots[arm]
                    )
                    seconds[arm] = r["seconds"] + r["upkeep_seconds"]
                    cpu[arm] = r["cpu_seconds"] + r["upkeep_cpu_seconds"]
            row = {
                **seconds,
                "before_vs_duckdb": seconds["before"] / seconds["duckdb"],
                "after_vs_duckdb": seconds["after"] / seconds["duckdb"],
                "after_vs_before": seconds["after"] / seconds["before"],
                "cpu_after_vs_before": cpu["after"] / cpu["before"],
                "cpu_before_vs_duckdb": cpu["before"] / cpu["duckdb"],
                "cpu_after_vs_duckdb": cpu["after"] / cpu["duckdb"],
                "load_average": os.getloadavg()[0],
            }
            print(json.dumps({"round": i, "order": arms, **row}), flush=True)
            rounds.append(row)
    medians = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
    return {"users": n_users, "events": n_events, "rounds": pairs, "median": medians}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--pairs", type=int, default=6, help="rounds of three arms")
    ap.add_argument("--users", type=int, default=1_000_000)
    args = ap.parse_args()
    result = compare(args.before.resolve(), args.after.resolve(), args.pairs, args.users)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
