"""The Python API: same engine as the CLI; privacy properties checked on it."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter import Monitor

ACTIVE = {
    "query_id": "active",
    "kind": "sum",
    "features": ["active"],
    "clip": 1.0,
    "from_day": "2026-01-01",
}
MIX = {
    "query_id": "mix",
    "kind": "linear",
    "weights": {"active": [1, 0], "minutes": [0, 0.01]},
    "clip": 2.0,
    "from_day": "2026-01-01",
}


def day(n):
    return f"2026-01-{n:02d}"


def test_api_shape_and_exact_sums_with_test_seed():
    m = Monitor(b_norm=4.0, rho=0.5, granularity=2**-10, exhaustion="skip", test_seed=3)
    m.add_query(ACTIVE)
    events = [{"user_id": f"u-{i}", "day": day(5), "values": {"active": 1}} for i in range(100)]
    rel = m.close_day(day(5), events)
    assert rel[0].day == day(5) and rel[0].query_id == "active" and len(rel[0].value) == 1
    assert rel[0].sigma == pytest.approx(2.0, rel=1e-6) and rel[0].ci95[0] == pytest.approx(
        1.96 * 2, rel=0.01
    )
    assert m.spent("u-17") == 1.0 and m.spent("never-seen") == 0.0
    assert abs(rel[0].value[0] - 100) < 12  # 6σ


def test_budget_exhaustion_drops_users_from_the_active_set():
    m = Monitor(b_norm=2.5, rho=100.0, granularity=2**-10, test_seed=1)  # tiny noise
    m.add_query(ACTIVE)
    values = []
    for d in range(1, 6):
        rel = m.close_day(
            day(d),
            [{"user_id": f"u-{i}", "day": day(d), "values": {"active": 1}} for i in range(50)],
        )
        values.append(rel[0].value[0])
    # each user can pay for two days (cost 1 each, B = 2.5): 50, 50, then nobody
    assert [round(v) for v in values] == [50, 50, 0, 0, 0]
    assert m.spent("u-3") == 2.0


def test_clip_policy_uses_the_remaining_budget():
    m = Monitor(b_norm=2.5, rho=1e5, granularity=2**-10, exhaustion="clip", test_seed=1)
    m.add_query(ACTIVE)
    sigma = m.params.sigma_released  # 0.005: 10σ bounds below
    vals = [
        m.close_day(day(d), [{"user_id": "u", "day": day(d), "values": {"active": 1}}])[0].value[0]
        for d in range(1, 5)
    ]
    assert abs(vals[0] - 1) < 10 * sigma and abs(vals[1] - 1) < 10 * sigma
    assert abs(vals[2] - 0.5**0.5) < 10 * sigma + 2**-9  # sqrt(remaining 0.5), up to rounding
    assert abs(vals[3]) < 10 * sigma
    assert m.spent("u") <= 2.5


def test_queries_for_closed_days_and_out_of_order_days_are_refused():
    m = Monitor(b_norm=4.0, rho=0.5, test_seed=1)
    m.close_day(day(5), [])
    with pytest.raises(ValueError, match="closed"):
        m.add_query({**ACTIVE, "from_day": day(5)})
    with pytest.raises(ValueError, match="not after"):
        m.close_day(day(4), [])
    m.add_query({**ACTIVE, "from_day": day(6)})


def test_invalid_events_are_recorded_not_accounted():
    m = Monitor(b_norm=4.0, rho=0.5, test_seed=1)
    m.add_query(ACTIVE)
    m.close_day(
        day(1),
        [
            b"{bad",
            {"user_id": "a", "day": day(2), "values": {"active": 1}},
            {"user_id": "b", "day": day(1), "values": {"active": float("nan")}},
        ],
    )
    assert [r.reason for r in m.rejects] == ["malformed_json", "wrong_day", "invalid_number"]
    assert m.spent("a") == 0 and m.spent("b") == 0


def test_epsilon_delta_calibration():
    m = Monitor(b_norm=4.0, epsilon=1.0, delta=1e-6)
    g = m.guarantee()
    assert g.epsilon <= 1.0 + 1e-9 and g.rho > 0


@settings(max_examples=60, deadline=None)
@given(
    activity=st.lists(st.lists(st.booleans(), min_size=6, max_size=6), min_size=1, max_size=8),
    minutes=st.lists(st.floats(0, 500), min_size=6, max_size=6),
    policy=st.sampled_from(["skip", "retire", "clip"]),
)
def test_absent_and_exhausted_user_give_identical_releases(activity, minutes, policy):
    """A user whose budget is spent must be indistinguishable from a user who never shows up."""

    def run(include_canary):
        m = Monitor(b_norm=1.0, rho=0.5, granularity=2**-8, exhaustion=policy, test_seed=99)
        m.add_query(ACTIVE)
        m.add_query(MIX)
        m.close_day(
            day(1),
            [{"user_id": "canary", "day": day(1), "values": {"active": 1}}]
            if include_canary
            else [],
        )  # spends the canary's whole budget (cost 1 = B)
        out = []
        for d, row in enumerate(activity, start=2):
            evs = [
                {"user_id": f"u{i}", "day": day(d), "values": {"active": 1, "minutes": minutes[i]}}
                for i in range(6)
                if row[i]
            ]
            if include_canary:
                evs.append(
                    {"user_id": "canary", "day": day(d), "values": {"active": 1, "minutes": 999.0}}
                )
            out.append([r.to_json() for r in m.close_day(day(d), evs)])
        return out, m

    with_canary, m1 = run(True)
    without, _ = run(False)
    assert m1.spent("canary") == 1.0
    assert with_canary == without


@settings(max_examples=40, deadline=None)
@given(perm_seed=st.integers(0, 2**32 - 1))
def test_permuting_users_changes_nothing(perm_seed):
    events = [
        {"user_id": f"u{i}", "day": day(1), "values": {"active": 1, "minutes": float(i * 37 % 101)}}
        for i in range(40)
    ]
    shuffled = list(np.random.default_rng(perm_seed).permutation(events))
    outs = []
    for evs in (events, shuffled):
        m = Monitor(b_norm=4.0, rho=0.5, test_seed=5)
        m.add_query(MIX)
        outs.append([r.to_json() for r in m.close_day(day(1), evs)])
    assert outs[0] == outs[1]


def test_repr_and_guarantee_give_the_total_rho_with_coverage_and_active_set() -> None:
    from streamfilter.telemetry.active_set import ActiveSetSpec
    from streamfilter.telemetry.coverage import CoverageSpec
    from streamfilter.telemetry.population import PopulationSpec

    for cov, act in [(None, None), (0.02, None), (None, 0.03), (0.02, 0.03)]:
        m = Monitor(
            b_norm=4,
            rho=0.5,
            coverage=None if cov is None else CoverageSpec(rho=cov),
            active_set=None if act is None else ActiveSetSpec(rho=act),
            population=PopulationSpec(),
        )
        g = m.guarantee()
        parts = m.rho_parts()
        assert set(parts) == {"queries"} | ({"coverage"} if cov else set()) | (
            {"active set"} if act else set()
        )
        assert sum(parts.values()) <= g.rho <= (0.5 + (cov or 0.0) + (act or 0.0)) * (1 + 1e-12)
        assert g.rho >= 0.5 + 0.9 * ((cov or 0.0) + (act or 0.0))
        assert repr(m).startswith(f"<Monitor {g.rho:g}-zCDP per user in total")
        assert f"({g.epsilon:.4g}, " in repr(m)
