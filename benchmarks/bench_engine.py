"""Day close: the vectorised engine next to a straightforward per-user Python filter.

Both run the same filter (clip → lattice rounding → exact integer cost → admission against the
running budget → exact integer sum) on the same day: ``n`` users with events, 4 queries, d = 8
in total (sum d=1, histogram d=3, linear d=2, sum d=2). The baseline is the loop a careful
engineer would write first: one Python iteration per user and query.
"""

from __future__ import annotations

import math
import statistics
import time
from fractions import Fraction

import numpy as np

from streamfilter.engine.contract import parse_query
from streamfilter.engine.day import close_day
from streamfilter.engine.ledger import BudgetLedger
from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.records import DayRecords
from streamfilter.privacy.noise import SeededRandomBits

QUERIES = [
    {
        "query_id": "active",
        "kind": "sum",
        "features": ["active"],
        "clip": 1.0,
        "from_day": "2026-01-01",
    },
    {
        "query_id": "plans",
        "kind": "histogram",
        "feature": "plan",
        "categories": ["free", "pro", "team"],
        "clip": 1.0,
        "from_day": "2026-01-01",
    },
    {
        "query_id": "mix",
        "kind": "linear",
        "weights": {"active": [1, 0], "minutes": [0, 0.01]},
        "clip": 2.0,
        "from_day": "2026-01-01",
    },
    {
        "query_id": "pair",
        "kind": "sum",
        "features": ["active", "sessions"],
        "clip": 3.0,
        "from_day": "2026-01-01",
    },
]
PARAMS = PrivacyParams.create(b_norm=8.0, rho=0.5, granularity=2.0**-10)
DAY = "2026-01-05"


def make_day(n: int, seed: int = 0) -> DayRecords:
    """Columns of one day: every user active, minutes, sessions and one plan."""
    rng = np.random.default_rng(seed)
    users = np.array([f"u-{i}" for i in range(n)], dtype=object)
    plans = np.array(["plan=free", "plan=pro", "plan=team"], dtype=object)[rng.integers(0, 3, n)]
    coords = np.concatenate(
        [
            np.full(n, "active", object),
            np.full(n, "minutes", object),
            np.full(n, "sessions", object),
            plans,
        ]
    )
    values = np.concatenate(
        [
            np.ones(n),
            np.round(rng.gamma(2.0, 6.0, n), 1),
            rng.integers(1, 4, n).astype(float),
            np.ones(n),
        ]
    )
    return DayRecords.from_columns(DAY, np.tile(users, 4), coords, values)


def ledger_with_history(records: DayRecords, seed: int = 1) -> BudgetLedger:
    """Half the users have already spent part of their budget (some close to exhausted)."""
    rng = np.random.default_rng(seed)
    ledger = BudgetLedger()
    users = records.users[::2]
    spent = rng.integers(0, PARAMS.budget_units, len(users)).astype(np.int64)
    ledger.apply(users, spent, np.zeros(len(users), bool))
    return ledger


def engine_close(records: DayRecords, ledger: BudgetLedger) -> list[list[float]]:
    queries = [parse_query(q) for q in QUERIES]
    out = close_day(records, queries, ledger, PARAMS, SeededRandomBits(0))
    return [r.value for r in out.releases]


def baseline_close(records: DayRecords, ledger: BudgetLedger) -> list[list[int]]:
    """Per-user Python loop over dicts: the straightforward implementation."""
    gamma = PARAMS.granularity
    budget = PARAMS.budget_units
    rows: dict[str, dict[str, float]] = {}
    users = records.users
    names = records.coord_names
    for u, c, v in zip(
        records.user_pos.tolist(), records.coord.tolist(), records.value.tolist(), strict=True
    ):
        rows.setdefault(users[u], {})[names[c]] = v
    spent = {u: s for u, s, _ in ledger.items()}
    totals = []
    for q in (parse_query(x) for x in QUERIES):
        coords, w = q.coordinates(), q.weights().tolist()
        cap = math.floor(Fraction(q.clip) ** 2 / Fraction(gamma) ** 2)
        d = len(w[0])
        total = [0] * d
        for user, rec in rows.items():
            x = [0.0] * d
            for name, row in zip(coords, w, strict=True):
                val = rec.get(name, 0.0)
                if val:
                    for j in range(d):
                        x[j] += val * row[j]
            norm = math.sqrt(sum(t * t for t in x)) / gamma
            scale = min(1.0, (q.clip / gamma) / norm) if norm > 0 else 1.0
            r = [round(t / gamma * scale) for t in x]
            cost = sum(t * t for t in r)
            while cost > cap:  # keep ‖r‖² ≤ cap exactly
                j = max(range(d), key=lambda k: abs(r[k]))
                r[j] -= 1 if r[j] > 0 else -1
                cost = sum(t * t for t in r)
            s = spent.get(user, 0)
            if s + cost <= budget:
                spent[user] = s + cost
                for j in range(d):
                    total[j] += r[j]
        totals.append(total)
    return totals


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(quick: bool = False) -> list[dict[str, object]]:
    n = 100_000 if quick else 1_000_000
    repeats = 3 if quick else 5
    records = make_day(n)
    ledger = ledger_with_history(records)
    engine_s = _median_seconds(lambda: engine_close(records, ledger), repeats)
    baseline_s = _median_seconds(lambda: baseline_close(records, ledger), 1 if not quick else 2)
    return [
        {
            "name": f"engine_day_close_{'100k' if quick else '1m'}",
            "value": round(engine_s, 4),
            "unit": "s",
            "baseline": "per-user Python loop (benchmarks/bench_engine.py:baseline_close)",
            "baseline_value": round(baseline_s, 4),
            "ratio": round(baseline_s / engine_s, 2),
            "detail": f"{n} users with events, 4 queries, d=8; median of {repeats} engine runs",
        }
    ]


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
