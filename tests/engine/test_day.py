"""The day close with analysts (docs/design.md §2.13): a contribution is admitted only if it fits
both the user's budget and its analyst's sub-budget, in exact lattice units; one analyst's
flood of expensive adaptive queries leaves another analyst's releases byte for byte as they
were; without quotas the same flood changes them."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from streamfilter.engine.contract import Reject, parse_event
from streamfilter.engine.day import SeededPerRelease
from streamfilter.engine.engine import Engine
from streamfilter.engine.monitor import Monitor
from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.records import DayAccumulator
from streamfilter.privacy.quotas import AnalystQuotas, analyst_key
from streamfilter.telemetry.coverage import CoverageSpec, CoverageTracker

GAMMA = 2.0**-10
UNIT = 2**20  # clip 1 at γ = 2^-10: one full contribution costs 2^20 lattice units


def _engine(shares: dict[str, float], b_norm: float = 4.0, exhaustion: str = "skip") -> Engine:
    params = PrivacyParams.create(b_norm=b_norm, rho=0.5, granularity=GAMMA, exhaustion=exhaustion)
    quotas = AnalystQuotas.from_shares(shares, params.budget_units)
    return Engine(params, SeededPerRelease(3), quotas=quotas)


def _query(query_id: str, analyst: str | None, clip: float = 1.0, **extra: Any) -> dict:
    q = {"query_id": query_id, "kind": "sum", "features": ["x"], "clip": clip}
    q["from_day"] = "2026-01-01"
    return {**q, **({"analyst": analyst} if analyst else {}), **extra}


def _close(engine: Engine, day: str, values: dict[str, float]):
    acc = DayAccumulator(day)
    for user, x in values.items():
        acc.add(parse_event({"user_id": user, "day": day, "values": {"x": x}}))
    outcome = engine.prepare_day(acc)
    engine.commit_day(outcome)
    return outcome


def test_a_contribution_must_fit_both_the_analysts_sub_budget_and_the_users_budget():
    engine = _engine({"growth": 0.25})  # B = 4·2^20: growth 2^20, default 3·2^20
    for query in (_query("g", "growth"), _query("d", None)):
        engine.register_query(engine.parse_query(query))
    admitted = []
    for day in range(1, 6):
        outcome = _close(engine, f"2026-01-0{day}", {"u": 5.0})
        admitted.append(outcome.exact_stats.admitted_per_query)
    # growth affords one full contribution, the default analyst three; then nothing
    assert [a["g"] for a in admitted] == [1, 0, 0, 0, 0]
    assert [a["d"] for a in admitted] == [1, 1, 1, 0, 0]
    assert engine.analyst_spent_units("u") == {"default": 3 * UNIT, "growth": UNIT}
    assert engine.ledger.spent_units("u") == 4 * UNIT


def test_the_global_budget_binds_a_state_spent_before_analysts():
    """A user who spent 3.5 of b_norm = 4 before analysts (all of it the default analyst's)
    gets only the 0.5 left, even from an analyst whose sub-budget is untouched; under ``clip``
    the contribution is cut to exactly what the global filter leaves."""
    engine = _engine({"growth": 0.5}, exhaustion="clip")
    engine.restore(
        budgets=[("u", 7 * UNIT // 2, False)], queries=[], last_closed_day=None, releases=[]
    )
    engine.register_query(engine.parse_query(_query("g", "growth")))
    assert engine.analyst_spent_units("u") == {"default": 7 * UNIT // 2, "growth": 0}
    outcome = _close(engine, "2026-01-01", {"u": 5.0})
    assert outcome.exact_stats.admitted_per_query == {"g": 1}
    spent = engine.ledger.spent_units("u")  # re-clipped to what is left, rounded down
    assert 4 * UNIT - 2048 < spent <= 4 * UNIT
    growth = spent - 7 * UNIT // 2
    assert engine.analyst_spent_units("u") == {"default": 7 * UNIT // 2, "growth": growth}
    # the day's budget rows: the user's entry and growth's, under its analyst key
    keys, units, _retired = outcome.budget_rows()
    assert dict(zip(keys.tolist(), units.tolist(), strict=True)) == {
        "u": spent,
        analyst_key("growth", "u"): growth,
    }


def test_under_retire_a_refusal_by_one_analysts_quota_retires_the_user_from_that_analyst_only():
    engine = _engine({"growth": 0.25}, exhaustion="retire")
    engine.register_query(engine.parse_query(_query("g", "growth", clip=2.0)))  # costs 4·2^20
    engine.register_query(engine.parse_query(_query("d", None)))
    first = _close(engine, "2026-01-01", {"u": 5.0})
    assert first.exact_stats.admitted_per_query == {"g": 0, "d": 1}
    assert engine.analyst_ledgers["growth"].retired("u") and not engine.ledger.retired("u")
    second = _close(engine, "2026-01-02", {"u": 5.0})
    assert second.exact_stats.admitted_per_query == {"g": 0, "d": 1}


def test_every_analyst_stays_within_its_sub_budget_and_the_spends_add_up():
    rng = random.Random(5)
    engine = _engine({"a": 0.3, "b": 0.45})
    queries = [("qa", "a", 0.7), ("qb", "b", 1.3), ("qd", None, 0.4), ("qa2", "a", 1.9)]
    for query_id, analyst, clip in queries:
        engine.register_query(engine.parse_query(_query(query_id, analyst, clip)))
    users = [f"u{i}" for i in range(40)]
    for day in range(1, 10):
        _close(
            engine, f"2026-01-0{day}", {u: rng.uniform(0, 3) for u in users if rng.random() < 0.8}
        )
    quotas = engine.quotas
    for user in users:
        by_analyst = engine.analyst_spent_units(user)
        assert sum(by_analyst.values()) == engine.ledger.spent_units(user) <= quotas.budget_units
        for name, units in by_analyst.items():
            assert 0 <= units <= quotas.sub_budget_units[name]
    assert (
        max(engine.analyst_spent_units(u)["a"] for u in users) > quotas.sub_budget_units["a"] // 2
    )


def test_queries_of_undeclared_analysts_are_refused():
    engine = _engine({"growth": 0.5})
    with pytest.raises(Reject, match="'ops' is not declared in \\[analysts\\]"):
        engine.register_query(engine.parse_query(_query("o", "ops")))
    stored = engine.parse_query(_query("o", "growth")).canonical_json().encode()
    fresh = _engine({})
    with pytest.raises(ValueError, match="query 'o' still stands but analyst 'growth'"):
        fresh.restore(budgets=[], queries=[stored], last_closed_day=None, releases=[])


def _flooded_run(shares: dict[str, float] | None, flood: bool) -> list[str]:
    """Ten days of 300 users. ``steady`` asks one sum a day; with ``flood``, ``flood`` registers
    a new expensive query every day whose clip depends on the latest releases (adaptive)."""
    monitor = Monitor(
        b_norm=16.0,
        rho=0.5,
        granularity=GAMMA,
        test_seed=7,
        coverage=CoverageSpec(rho=0.05, levels=4, first_epoch_days=8),
        analysts=shares,
    )
    steady = "steady" if shares else None
    monitor.add_query(_query("s1", steady, clip=1.0, features=["x"]))
    released: list[str] = []
    for d in range(1, 11):
        day = f"2026-01-{d:02d}"
        if flood and d >= 2:
            latest = monitor.releases[-1].value[0]
            clip = 3.0 + (1.0 if latest > 0 else 0.5)
            monitor.add_query(
                _query(f"f{d}", "flood" if shares else None, clip=clip, from_day=day)
                | {"features": ["x", "y"]}
            )
        rng = random.Random(d)
        events = [
            {
                "user_id": f"u{i}",
                "day": day,
                "values": {"x": rng.uniform(0, 2), "y": rng.uniform(0, 4)},
            }
            for i in range(300)
        ]
        released += [r.to_json() for r in monitor.close_day(day, events) if r.query_id == "s1"]
    return released


def test_an_analysts_flood_does_not_change_another_analysts_releases():
    """Shares summing to 1: steady's releases — values and coverage — are the same bytes with
    and without flood's expensive adaptive queries (noise is keyed per day and query, coverage
    counted per analyst)."""
    shares = {"steady": 0.4, "flood": 0.6}
    quiet, flooded = _flooded_run(shares, flood=False), _flooded_run(shares, flood=True)
    assert len(quiet) == 10 and '"coverage"' in quiet[-1] and '"analyst": "steady"' in quiet[-1]
    assert flooded == quiet


def test_without_quotas_the_same_flood_changes_the_other_releases():
    quiet, flooded = _flooded_run(None, flood=False), _flooded_run(None, flood=True)
    assert flooded != quiet
    changed = [a != b for a, b in zip(quiet, flooded, strict=True)]
    assert not changed[0] and sum(changed) >= 5  # the flood starts on day 2 and exhausts users


def test_coverage_counts_each_analyst_against_its_own_sub_budget():
    engine = _engine({"growth": 0.25})
    engine.coverage = CoverageTracker.create(
        CoverageSpec(rho=10.0, levels=2, first_epoch_days=2), engine.params, engine.quotas
    )
    assert [name for name, _ in engine.coverage.groups()] == ["default", "growth"]
    assert engine.coverage.thresholds_units == (3 * UNIT // 2, 3 * UNIT, UNIT // 2, UNIT)
    for query in (_query("g", "growth"), _query("d", None)):
        engine.register_query(engine.parse_query(query))
    users = {f"u{i}": 5.0 for i in range(2000)}
    outcome = _close(engine, "2026-01-01", users)
    by_query = {r.query_id: r.coverage for r in outcome.releases}
    # after one day every user has spent growth's whole sub-budget and a third of the default's
    assert by_query["g"] is not None and by_query["d"] is not None
    assert abs(by_query["g"].users) < 5 * by_query["g"].sigma  # nobody can afford growth's query
    assert abs(by_query["d"].users - 2000) < 5 * by_query["d"].sigma  # everybody the default's
    assert np.isclose(by_query["d"].threshold, UNIT * GAMMA**2 * 1.5)
