"""A day split into parts (cluster mode, docs/design.md §7.2) gives the single process's day:
the parts' exact partial sums add up to its exact sums, the parts' debits are its debits, and
``release_partials`` on the summed parts publishes its releases byte for byte under a test seed.
Days run in order with budgets carried over, so exhaustion (skip/retire/clip) is exercised."""

from __future__ import annotations

import random

import numpy as np
import pytest

from streamfilter.engine.contract import parse_event, parse_query
from streamfilter.engine.day import (
    SeededPerRelease,
    close_day,
    coverage_counts_of,
    partial_day,
    release_partials,
)
from streamfilter.engine.ledger import BudgetLedger
from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.records import DayAccumulator
from streamfilter.telemetry.coverage import CoverageSpec, CoverageTracker

QUERIES = [
    parse_query(q)
    for q in (
        {"query_id": "a", "kind": "sum", "features": ["x"], "clip": 1.0, "from_day": "2026-01-01"},
        {
            "query_id": "h",
            "kind": "histogram",
            "feature": "plan",
            "categories": ["free", "pro"],
            "clip": 1.0,
            "from_day": "2026-01-01",
        },
        {
            "query_id": "l",
            "kind": "linear",
            "weights": {"x": [1, 0], "y": [0, 0.5]},
            "clip": 2.0,
            "from_day": "2026-01-02",
        },
    )
]


def _events(day: str, rng: random.Random, users: int) -> list:
    out = []
    for u in range(users):
        for _ in range(rng.choice([0, 1, 1, 2])):  # several events of one user: combined
            values = {
                "x": rng.uniform(0, 2),
                "y": rng.uniform(-3, 3),
                "plan": rng.choice(["free", "pro"]),
            }
            out.append(parse_event({"user_id": f"u{u}", "day": day, "values": values}))
    return out


def _records(day: str, events: list):
    acc = DayAccumulator(day)
    for ev in events:
        acc.add(ev)
    return acc.finish()


@pytest.mark.parametrize("with_coverage", [False, True])
@pytest.mark.parametrize("exhaustion", ["skip", "retire", "clip"])
@pytest.mark.parametrize("n_parts", [1, 2, 5])
def test_parts_add_up_to_the_single_process_day(exhaustion, n_parts, with_coverage):
    """... and, with coverage, the parts' summed counts step the tracker exactly as the single
    process's day close does (same releases with their coverage, same tracker after each day)."""
    params = PrivacyParams.create(b_norm=4.0, rho=0.5, granularity=2.0**-8, exhaustion=exhaustion)
    bits = SeededPerRelease(3)
    spec = CoverageSpec(rho=0.02, levels=4, first_epoch_days=2)
    single_tracker = CoverageTracker.create(spec, params) if with_coverage else None
    parts_tracker = single_tracker
    thresholds = None if single_tracker is None else single_tracker.thresholds_units
    rng = random.Random(n_parts)
    whole = BudgetLedger()
    shared: dict[str, tuple[int, bool]] = {}  # the cluster's budgets table
    for d in range(1, 5):
        day = f"2026-01-0{d}"
        events = _events(day, rng, 150)
        queries = [q for q in QUERIES if q.applies_to(day)]
        single = close_day(
            _records(day, events), queries, whole, params, bits, coverage=single_tracker
        )
        single_tracker = single.coverage
        whole.apply(single.changed_users, single.spent_units, single.retired)
        sums = {q.query_id: np.zeros(q.weights().shape[1], np.int64) for q in queries}
        changed: dict[str, tuple[int, bool]] = {}
        counters: dict[str, int] = {}
        for part in range(n_parts):
            mine = [e for e in events if hash(e.user_id) % n_parts == part]
            records = _records(day, mine)
            ledger = BudgetLedger()
            known = [(u, *shared[u]) for u in map(str, records.users) if u in shared]
            if known:
                users, spent, retired = zip(*known, strict=True)
                ledger.apply(np.array(users, object), np.array(spent), np.array(retired))
            p = partial_day(records, queries, ledger, params, thresholds)
            for q, s in p.sums.items():
                sums[q] += s
            for name, n in p.counters.items():
                counters[name] = counters.get(name, 0) + n
            for u, s, r in zip(p.changed_users, p.spent_units, p.retired, strict=True):
                assert str(u) not in changed  # each user in one part only
                changed[str(u)] = (int(s), bool(r))
        shared.update(changed)
        want = {
            str(u): (int(s), bool(r))
            for u, s, r in zip(
                single.changed_users, single.spent_units, single.retired, strict=True
            )
        }
        assert changed == want
        coverage = None
        if parts_tracker is not None:
            counts = coverage_counts_of(counters, len(parts_tracker.thresholds_units))
            coverage = (parts_tracker, counts)
        got, parts_tracker = release_partials(day, queries, sums, params, bits, coverage)
        assert [r.to_json() for r in got] == [r.to_json() for r in single.releases]
        if with_coverage:
            assert all(r.coverage is not None for r in got)
            assert parts_tracker is not None and single_tracker is not None
            assert parts_tracker.to_json() == single_tracker.to_json()
