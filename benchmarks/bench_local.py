"""Local-mode server ingest: contributions/s next to central-mode events/s, same daemon path.

One day of ``n`` users, each active: the central daemon reads their ``n`` events (validate,
accumulate, run every user's filter for 3 queries, commit the ledger, release); the local-mode
daemon reads the ``n·q`` contributions their devices would send for the same 3 queries
(validate against the query — dimension, lattice, norm — sum, release; no per-user state). Both
are ``build_daemon`` + ``run(until_end=True)`` over a file in the same process, timed without
Python start-up; the median of ``repeats`` runs is reported. The ratio compares *records* per
second, so it shows the cost of one contribution against one event.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import entry
from streamfilter.client import Announcement, DeviceConfig, DeviceFleet
from streamfilter.config import load_config
from streamfilter.engine.contract import parse_event, parse_query
from streamfilter.engine.records import DayAccumulator
from streamfilter.policies import standing_monitoring
from streamfilter.privacy.noise import SeededRandomBits
from streamfilter.runtime.app import build_daemon

DAY = "2026-01-01"
# the example policy's three standing queries (active, plans, hours); from_day set per run
QUERIES = standing_monitoring([], "2026-01-01")


def _write_inputs(tmp: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    plans = ["free", "pro", "team"]
    events = [
        json.dumps(
            {
                "user_id": f"u-{i}",
                "day": DAY,
                "values": {
                    "active": 1,
                    "minutes": float(rng.integers(1, 120)),
                    "plan": plans[int(rng.integers(3))],
                },
            }
        ).encode()
        for i in range(n)
    ]
    (tmp / "events.jsonl").write_bytes(b"".join(e + b"\n" for e in events))
    queries = [{**q, "from_day": DAY} for q in QUERIES]
    (tmp / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    # the contributions the users' devices send for the same queries (real LocalFilter code)
    acc = DayAccumulator(DAY)
    for e in events:
        acc.add(parse_event(e))
    records = acc.finish()
    announced = [Announcement.parse(parse_query(q).canonical_json()) for q in queries]
    fleet = DeviceFleet(DeviceConfig.create(b_norm=4.0, granularity=2.0**-10, rho=0.5))
    ans = fleet.answer(
        DAY, announced, records.users, [records.matrix(list(a.coordinates)) for a in announced]
    )
    lines = [c.to_json() for c in ans.contributions(DAY, SeededRandomBits(0))]
    (tmp / "contributions.jsonl").write_bytes(b"".join(x + b"\n" for x in lines))


def _config(tmp: Path, mode: str, run: int) -> Path:
    text = (
        "[privacy]\nb_norm = 4.0\nrho = 0.5\n"
        f'[source]\nkind = "file"\npath = "{tmp}/events.jsonl"\n'
        f'[queries]\nkind = "file"\npath = "{tmp}/queries.jsonl"\n'
        f'[sink]\nkind = "file"\npath = "{tmp}/{mode}-{run}.jsonl"\n'
        f'[state]\npath = "{tmp}/{mode}-{run}.db"\n'
        f'[mode]\nkind = "{mode}"\n[local]\npath = "{tmp}/contributions.jsonl"\n'
    )
    path = tmp / f"{mode}-{run}.toml"
    path.write_text(text)
    return path


def _rate(tmp: Path, mode: str, run: int) -> tuple[float, int]:
    parts = build_daemon(load_config(_config(tmp, mode, run)), follow=False)
    try:
        started = time.perf_counter()
        summary = parts.daemon.run(until_end=True)
        seconds = time.perf_counter() - started
    finally:
        parts.close()
    assert summary.days_closed == 1 and not summary.rejects, summary.as_dict()
    return summary.records_read / seconds, summary.records_read


def run(quick: bool = False) -> list[dict[str, object]]:
    n = 20_000 if quick else 300_000
    repeats = 3 if quick else 5
    with tempfile.TemporaryDirectory(prefix="bench-local-") as d:
        tmp = Path(d)
        _write_inputs(tmp, n)
        local, central = [], []
        for r in range(repeats):  # paired, the order alternating, so machine noise hits both
            for mode in ("local", "central") if r % 2 == 0 else ("central", "local"):
                rate, count = _rate(tmp, mode, r)
                if mode == "local":
                    local.append(rate)
                    n_contrib = count
                else:
                    central.append(rate)
                    n_events = count
    lv, cv = statistics.median(local), statistics.median(central)
    ratios = [a / b for a, b in zip(local, central, strict=True)]
    return [
        entry(
            "local_ingest_contributions",
            value=round(lv),
            unit="records/s",
            baseline="central-mode daemon, events/s (same users, same 3 queries)",
            baseline_value=round(cv),
            ratio=round(statistics.median(ratios), 2),
            ratio_definition="median over paired runs of local ÷ central records per second",
            runs=repeats,
            size=f"{n_contrib:,} contributions vs {n_events:,} events of one day",
            detail=(
                "local-mode server (validate against the query, sum, release; no per-user "
                "state) vs the central daemon (validate, accumulate, filter every user, commit "
                "the ledger); file source, SQLite state; paired runs, order alternated, ratios "
                + ", ".join(f"{r:.2f}" for r in ratios)
            ),
        )
    ]


if __name__ == "__main__":
    for result in run(quick=False):
        print(result)
