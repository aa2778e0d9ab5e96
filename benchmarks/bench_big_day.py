"""``big_day``: one very large day end to end — time, peak RSS and where the time goes.

A 10M-user day and a 100M-event day, each through the whole operation a user runs:
``streamfilter run --until-end`` on a JSONL file (a new process: imports, config, SQLite state,
file source and sink, the day's close with the privacy filter, noise, the durable commit and the
releases). The stream is the one of ``bench_e2e`` (``active``, ``minutes`` with two decimals,
``plan`` among 3 categories, an event id per event) on a single day: ``events_per_user`` rounds,
each with every user once in a fresh random order.

The run is sampled by py-spy (the dev extra; sampling, so the code runs unchanged) at a low rate,
and the profile is summarised by ``benchmarks/spy_summary.py``: the share of samples by leaf
function and by frame. The entry reports wall seconds, peak RSS (``ru_maxrss`` of the child) and
the top of the profile. There is no side-by-side baseline here: ``e2e_file_days`` is the
comparison; this entry answers whether the day fits on the machine and what bounds it.

Not in ``make bench`` (minutes to an hour): ``python -m benchmarks.bench_big_day --users
10000000 --events-per-user 1`` (and ``--events-per-user 10`` for 100M events); the result is
written to ``benchmarks/results/big_day_<users>x<k>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bench_e2e import CONFIG, QUERIES
from benchmarks.common import entry, machine, upkeep_left
from benchmarks.spy_summary import summarise

DAY = "2026-03-01"
PLANS = ("free", "pro", "team")


def write_day(path: Path, n_users: int, events_per_user: int, seed: int = 0) -> int:
    """The day's JSONL (rounds of all users, each round shuffled); returns the event count."""
    rng = np.random.default_rng(seed)
    n = 0
    with path.open("w") as f:
        for r in range(events_per_user):
            order = rng.permutation(n_users)
            minutes = np.round(rng.exponential(20.0, n_users), 2)
            for lo in range(0, n_users, 1_000_000):
                chunk = order[lo : lo + 1_000_000].tolist()
                mins = minutes[lo : lo + 1_000_000].tolist()
                f.write(
                    "".join(
                        f'{{"user_id": "user-{u}", "day": "{DAY}", "event_id": "e{u}-{r}", '
                        f'"values": {{"active": 1, "minutes": {m!r}, "plan": "{PLANS[u % 3]}"}}}}\n'
                        for u, m in zip(chunk, mins, strict=True)
                    )
                )
            n += n_users
    return n


def run(n_users: int, events_per_user: int, rate_hz: int = 5) -> dict:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BIG_DAY_DIR")) as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        n_events = write_day(work / "events.jsonl", n_users, events_per_user)
        write_s = time.perf_counter() - t0
        size_gib = (work / "events.jsonl").stat().st_size / 2**30
        (work / "queries.jsonl").write_text(
            "".join(json.dumps({**q, "from_day": DAY}) + "\n" for q in QUERIES)
        )
        (work / "config.toml").write_text(CONFIG)
        exe = str(Path(sys.executable).with_name("streamfilter"))
        argv = [exe, "run", "--config", str(work / "config.toml"), "--until-end"]
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        raw = work / "profile.raw"
        cmd = [spy, "record", "-r", str(rate_hz), "-f", "raw", "-o", str(raw), "--", *argv]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=work, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        total, own, inclusive = summarise(raw, "main (")
        # py-spy exits 0 even when its child was killed (e.g. by the kernel's OOM killer): the
        # day closed only if its releases are in the sink
        releases = work / "releases.jsonl"
        released = len(releases.read_text().splitlines()) if releases.exists() else 0
        closed = released >= len(QUERIES)
        upkeep_entries, upkeep_s = upkeep_left(work / "state.db") if closed else (0, 0.0)
    top_self = [(f, round(100 * c / max(total, 1), 1)) for f, c in own.most_common(12)]
    top_incl = [(f, round(100 * c / max(total, 1), 1)) for f, c in inclusive.most_common(30)]
    return entry(
        f"big_day_{n_users}x{events_per_user}",
        value=round(wall, 1),
        unit="s",
        baseline="none here: e2e_file_days is the side-by-side comparison",
        baseline_value=None,
        ratio=None,
        ratio_definition="",
        target="the day closes on this machine (24 GiB)",
        target_met=closed,
        runs=1,
        size=f"{n_users:,} users × {events_per_user} events, {n_events:,} events ({size_gib:.1f} GiB)",
        detail=(
            ("" if closed else f"DID NOT CLOSE ({released} of {len(QUERIES)} releases); ")
            + f"`streamfilter run --until-end` under py-spy at {rate_hz} Hz; peak RSS "
            f"{peak_mib:,.0f} MiB; writing the file took {write_s:.0f} s (not timed); the "
            f"run left {upkeep_entries:,} budget-log entries to the next run's upkeep, which "
            f"folds them in {upkeep_s:.1f} s (measured after the run, not in its time); "
            f"load average at the end {os.getloadavg()[0]:.1f}"
        ),
        peak_rss_mib=round(peak_mib),
        day_closed=closed,
        upkeep_left_entries=upkeep_entries,
        upkeep_left_seconds=round(upkeep_s, 1),
        profile_self=top_self,
        profile_inclusive=top_incl,
        machine=machine(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=10_000_000)
    parser.add_argument("--events-per-user", type=int, default=1)
    parser.add_argument("--rate", type=int, default=5, help="py-spy samples per second")
    args = parser.parse_args()
    result = run(args.users, args.events_per_user, args.rate)
    out = Path(__file__).parent / "results" / f"big_day_{args.users}x{args.events_per_user}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
