"""Coverage with every release (docs/design.md §2.11): the exact per-day
counts, the unbounded epoch counters, their accounting and their noise, statistically."""

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from streamfilter.engine.contract import Coverage, Release
from streamfilter.engine.monitor import Monitor
from streamfilter.engine.params import PrivacyParams
from streamfilter.privacy.continual import (
    EpochCounter,
    discrete_gaussian_sum_halfwidth,
    noise_halfwidth,
    noise_variance,
)
from streamfilter.privacy.discrete_gaussian_moments import discrete_gaussian_variance
from streamfilter.privacy.noise import SeededRandomBits
from streamfilter.telemetry.coverage import (
    CoverageCounts,
    CoverageSpec,
    CoverageTracker,
    coverage_counts,
    coverage_thresholds_units,
)
from tests.support import oracle

PARAMS = PrivacyParams.create(b_norm=4.0, rho=0.5, granularity=2.0**-10, exhaustion="skip")
B = PARAMS.budget_units  # 4·2^20


# ---------------------------------------------------------------------------- exact day counts
def test_the_thresholds_are_a_fixed_ladder_below_the_budget():
    assert coverage_thresholds_units(B, 3) == (B // 4, B // 2, B)
    assert coverage_thresholds_units(5, 8) == (1, 2, 5)  # distinct and positive only
    with pytest.raises(ValueError, match="levels"):
        coverage_thresholds_units(B, 0)


def test_a_user_is_counted_once_and_departs_each_threshold_once():
    taus = (2, 5, 10)
    # B = 10; users: fresh→spent 3 (counted, departs τ=10), 3→6 (departs τ=5), 6→9
    # (departs τ=2), retired at 0 (counted, departs all), untouched (nothing), 9→9 (nothing)
    sb = np.array([0, 3, 6, 0, 0, 9])
    sa = np.array([3, 6, 9, 0, 0, 9])
    rb = np.zeros(6, bool)
    ra = np.array([0, 0, 0, 1, 0, 0], bool)
    c = coverage_counts(sb, rb, sa, ra, 10, taus)
    assert c == CoverageCounts(counted=2, departed=(2, 2, 2))


def test_the_day_counts_are_sums_over_users_so_partitions_add():
    rng = np.random.default_rng(0)
    n, budget, taus = 1000, 100, (12, 25, 50, 100)
    sb = rng.integers(0, 60, n) * (rng.random(n) < 0.7)
    sa = sb + rng.integers(0, 50, n) * (rng.random(n) < 0.5)
    rb = rng.random(n) < 0.05
    ra = rb | (rng.random(n) < 0.05)
    whole = coverage_counts(sb, rb, sa, ra, budget, taus)
    parts = [slice(0, 300), slice(300, 301), slice(301, n)]
    added = CoverageCounts(0, (0,) * len(taus))
    for p in parts:
        added = added + coverage_counts(sb[p], rb[p], sa[p], ra[p], budget, taus)
    assert added == whole


def test_a_ledger_that_goes_backwards_is_refused():
    with pytest.raises(ValueError, match="backwards"):
        coverage_counts(np.array([5]), np.zeros(1, bool), np.array([4]), np.zeros(1, bool), 9, (1,))


# ---------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("first", [1, 2, 128, 1024])
@pytest.mark.parametrize("m", [1, 2, 9, 17])
@pytest.mark.parametrize("rho", [1e-4, 0.01, 0.3, 5.0])
def test_every_epoch_costs_one_user_at_most_rho_over_m(first, m, rho):
    """The unbounded guarantee: a user is in one epoch per stream, and every epoch's tree has
    L_e/(2 s_e²) ≤ ρ/m (exact rationals, every epoch up to the 2^30-step cap)."""
    counter = EpochCounter(first, m, rho)
    e = 1
    while (first << (e - 1)) <= 1 << 30:
        tree = counter.tree(e)
        assert tree.horizon == first << (e - 1)
        assert Fraction(m * tree.levels, 2 * tree.sigma2_units) <= Fraction(rho)
        e += 1
    assert m * counter.rho_per_counter() <= Fraction(rho)


def test_the_tracker_states_its_rho_within_the_configured_one():
    tracker = CoverageTracker.create(CoverageSpec(rho=0.02), PARAMS)
    assert tracker.counter.counters == len(tracker.thresholds_units) + 1 == 9
    assert 0.019 < tracker.rho <= 0.02


# ---------------------------------------------------------------------------- the noise
def test_noise_halfwidth_of_one_pair_is_the_tree_counters_and_of_several_is_wider():
    assert noise_halfwidth(((50, 3),)) == discrete_gaussian_sum_halfwidth(50, 3)
    assert noise_halfwidth(()) == 0
    mixed = noise_halfwidth(((50, 3), (200, 1)))
    v = noise_variance(((50, 3), (200, 1)))
    assert v == pytest.approx(3 * discrete_gaussian_variance(50) + discrete_gaussian_variance(200))
    assert abs(mixed - 1.959964 * math.sqrt(v)) <= 1.0  # a sum of Gaussians: nearly normal


def _errors(counter, counts, trials, seed):
    """Per trial and step: released running total − exact running total."""
    out = np.empty((trials, len(counts)), np.int64)
    bits = SeededRandomBits(seed)
    for i in range(trials):
        state = counter.initial_state()
        total = 0
        for t, c in enumerate(counts):
            step = counter.step(state, c, bits)
            total += c
            out[i, t] = step.value - total
            state = step.state
    return out


def oracle_counter_variance(first: int, m: int, rho: float, t: int) -> float:
    """Variance of an epoch counter's running total after ``t`` steps, from the construction
    alone (docs/design.md §2.11): epoch ``e`` is a binary tree over ``h_e = first·2^(e−1)`` steps
    with ``L_e = bit_length(h_e)`` levels and ``N_Z(0, s_e²)`` per node, ``s_e² = ceil(m·L_e/(2ρ))``
    (CKS 2020 Prop. 5: ``m`` counters of sensitivity² ``L_e`` each cost ``≤ ρ``). A closed epoch
    adds its root; the open one the ``popcount`` of its local step (Chan, Shi & Song 2011)."""
    var, start, e = 0.0, 0, 1
    while True:
        h = first << (e - 1)
        s2 = math.ceil(Fraction(m * h.bit_length()) / (2 * Fraction(rho)))
        if t <= start + h:
            return var + (t - start).bit_count() * oracle.discrete_gaussian_variance(s2)
        var += oracle.discrete_gaussian_variance(s2)
        start, e = start + h, e + 1


def test_the_epoch_counter_is_unbiased_with_the_oracle_variance_across_epochs():
    """first_horizon 2: epochs of 2, 4, 8 steps, so 9 steps cross two boundaries (carries);
    ``m = 3`` counters so that a calibration without ``m`` draws a third of the variance.

    For each step, with n = 3000 trials, the errors are checked against the variance computed
    above (not the one the counter states): a two-sided χ² at α = 10⁻³ shared by the 9 steps'
    variance and mean checks, so a correct counter passes with probability ≥ 0.999 and one whose
    σ is off by √2 either way fails at every single step with probability ≥ 0.999
    (``oracle.assert_power``)."""
    counter = EpochCounter(2, 3, 2.25)  # s² = ceil(3L/4.5): 2, 2, 3 over the first epochs
    counts = [3, 0, 7, 1, 0, 2, 5, 0, 1]
    n = 3000
    checks = 2 * len(counts)
    err = _errors(counter, counts, n, seed=11)
    state = counter.initial_state()
    for t, c in enumerate(counts, start=1):
        v = oracle_counter_variance(2, 3, 2.25, t)
        oracle.assert_mean_zero(err[:, t - 1], v, checks)
        oracle.assert_variance(err[:, t - 1], v, checks=checks)
        step = counter.step(state, c, SeededRandomBits(0))
        state = step.state
        assert noise_variance(step.noise) == pytest.approx(v, rel=1e-12), t  # what it states
    # the noise bookkeeping: after step 2 (end of epoch 1) the total is the root alone
    s2 = [counter.tree(e).sigma2_units for e in (1, 2, 3)]
    state = counter.initial_state()
    noises = []
    for c in counts:
        step = counter.step(state, c, SeededRandomBits(0))
        state = step.state
        noises.append(step.noise)
    assert noises[1] == ((s2[0], 1),)
    assert noises[2] == ((s2[0], 1), (s2[1], 1))
    assert noises[5] == ((s2[0], 1), (s2[1], 1))  # step 6 closes epoch 2 (4 steps): its root
    assert noises[8] == ((s2[0], 1), (s2[1], 1), (s2[2], 2))  # popcount(3) = 2 nodes of epoch 3


def test_coverage_estimates_are_unbiased_with_the_oracle_variance_and_hold_95_percent():
    """A population over 5 days with known exact coverage; n = 2000 independent runs.

    Each day, the covered-users estimate (counted − departed at the middle threshold) is checked
    against the variance the test computes from the construction: two independent epoch
    counters, each with ``m = levels + 1 = 4`` streams sharing ρ = 0.5
    (:func:`oracle_counter_variance`). Mean and variance checks (two-sided χ², α = 10⁻³ shared
    by the 10 checks): a correct tracker passes with probability ≥ 0.999, a σ off by √2 either
    way — or noise calibrated without ``m``, σ halved — fails at each day with probability ≥
    0.999. The stated σ is the oracle's, and the stated 95% half-width holds in 0.95 ± 0.03 of
    the runs (binomial sd 0.0049: 6 sd)."""
    spec = CoverageSpec(rho=0.5, levels=3, first_epoch_days=2)
    tracker = CoverageTracker.create(spec, PARAMS)
    assert len(tracker.thresholds_units) == 3
    days = [
        CoverageCounts(1000, (0, 0, 300)),
        CoverageCounts(200, (0, 100, 400)),
        CoverageCounts(0, (50, 300, 200)),
        CoverageCounts(10, (300, 200, 100)),
        CoverageCounts(0, (100, 50, 20)),
    ]
    cost = tracker.thresholds_units[1]  # a query mapped exactly onto the middle threshold
    exact, counted, departed = [], 0, 0
    for c in days:
        counted += c.counted
        departed += c.departed[1]
        exact.append(counted - departed)
    n = 2000
    users = np.empty((n, len(days)))
    inside = np.zeros(len(days))
    stated = []
    bits = SeededRandomBits(5)
    for i in range(n):
        t = tracker
        for k, c in enumerate(days):
            est, t = t.step(c, bits)
            cov = est.for_cost(cost, PARAMS.granularity)
            users[i, k] = cov.users
            inside[k] += abs(cov.users - exact[k]) <= cov.ci95
            if i == 0:
                stated.append(cov.sigma)
    checks = 2 * len(days)
    for k in range(len(days)):
        v = 2 * oracle_counter_variance(2, 4, 0.5, k + 1)
        err = users[:, k] - exact[k]
        oracle.assert_mean_zero(err, v, checks)
        oracle.assert_variance(err, v, checks=checks)
        assert stated[k] == pytest.approx(math.sqrt(v), rel=1e-12), k
        assert abs(inside[k] / n - 0.95) < 0.03, (k, inside[k] / n)


def test_a_query_maps_to_the_smallest_threshold_that_covers_its_cost():
    tracker = CoverageTracker.create(CoverageSpec(rho=1.0, levels=3), PARAMS)
    est, _ = tracker.step(CoverageCounts(0, (0, 0, 0)), SeededRandomBits(1))
    g = PARAMS.granularity
    assert est.for_cost(1, g).threshold == pytest.approx(1.0)  # B/4 = 1.0 data units²
    assert est.for_cost(B // 4 + 1, g).threshold == pytest.approx(2.0)
    assert est.for_cost(B, g).threshold == pytest.approx(4.0)
    nobody = est.for_cost(B + 1, g)  # clip² > B_norm: exactly 0, no noise, noise only
    assert (nobody.threshold, nobody.users, nobody.sigma, nobody.ci95) == (None, 0, 0.0, 0.0)
    assert nobody.noise_only


def test_the_tracker_survives_a_round_trip_and_resumes_exactly():
    spec = CoverageSpec(rho=0.3, levels=4, first_epoch_days=2)
    days = [CoverageCounts(50 + d, (d, 2 * d, 0, 3)) for d in range(7)]

    def run(restart_at):
        t = CoverageTracker.create(spec, PARAMS)
        out = []
        for k, c in enumerate(days):
            if k == restart_at:
                t = CoverageTracker.from_json(t.to_json())
            est, t = t.step(c, SeededRandomBits(100 + k))
            out.append((est.counted, est.departed))
        return out, t

    a, ta = run(None)
    b, tb = run(4)
    assert a == b and ta == tb
    assert "exact" in ta.to_json()  # sensitive partial sums: stored, never published
    with pytest.raises(ValueError, match="thresholds"):
        CoverageTracker.step(ta, CoverageCounts(1, (0,)), SeededRandomBits(1))


def test_a_release_carries_its_coverage_through_json():
    cov = Coverage(
        users=812, sigma=9.5, ci95=19.0, fraction=0.31, counted_users=2600, threshold=1.0
    )
    rel = Release(
        "2026-01-01", "q", ["x"], [1.0], 2.0, [3.9], "discrete_gaussian", 1.0, coverage=cov
    )
    text = rel.to_json()
    assert json.loads(text)["coverage"] == {
        "users": 812,
        "sigma": 9.5,
        "ci95": 19.0,
        "fraction": 0.31,
        "counted_users": 2600,
        "threshold": 1.0,
    }
    assert Release.from_json(text) == rel
    assert not cov.noise_only and Coverage(5, 3.0, 6.0, None, 10, 1.0).noise_only


def test_in_the_engine_coverage_follows_the_users_who_run_out_of_budget():
    """2000 users active every day, b_norm 4, clip 1: each pays 1 a day, so after day 1 all can
    still afford the query, after day 4 nobody (remaining 0): coverage 2000 → 0, within its
    stated interval of the exact value; the value falls with it."""
    m = Monitor(b_norm=4.0, rho=0.5, test_seed=3)
    m._engine.coverage = CoverageTracker.create(CoverageSpec(rho=0.5), m.params)
    m.add_query(
        {"query_id": "a", "kind": "sum", "features": ["x"], "clip": 1.0, "from_day": "2026-01-01"}
    )
    exact = [2000, 2000, 2000, 0, 0]
    for d, want in enumerate(exact, start=1):
        day = f"2026-01-0{d}"
        (rel,) = m.close_day(
            day, [{"user_id": f"u{i}", "day": day, "values": {"x": 1.0}} for i in range(2000)]
        )
        assert rel.coverage is not None
        assert abs(rel.coverage.users - want) <= 2 * rel.coverage.ci95, (day, rel.coverage)
        assert abs(rel.coverage.counted_users - 2000) <= 4 * rel.coverage.ci95
        if want == 0:
            assert rel.coverage.fraction is not None and rel.coverage.fraction < 0.1
    # day 4 admitted everybody (remaining 1 ≥ 1) yet coverage at its close is 0: a lower bound


def test_a_persistent_monitor_resumes_its_coverage_exactly(tmp_path):
    from streamfilter.runtime.notebook import PersistentMonitor

    spec = CoverageSpec(rho=0.5, first_epoch_days=2)
    query = {
        "query_id": "a",
        "kind": "sum",
        "features": ["x"],
        "clip": 1.0,
        "from_day": "2026-01-01",
    }

    def events(day):
        return [{"user_id": f"u{i}", "day": day, "values": {"x": 1.0}} for i in range(50)]

    days = [f"2026-01-0{d}" for d in range(1, 6)]
    whole = Monitor(b_norm=4.0, rho=0.5, test_seed=9, coverage=spec)
    whole.add_query(query)
    want = [r.to_json() for d in days for r in whole.close_day(d, events(d))]
    got = []
    with PersistentMonitor.open(tmp_path / "s.db", 4.0, rho=0.5, test_seed=9, coverage=spec) as m:
        m.add_query(query)
        got += [r.to_json() for d in days[:3] for r in m.close_day(d, events(d))]
    with PersistentMonitor.open(tmp_path / "s.db", 4.0, rho=0.5, test_seed=9, coverage=spec) as m:
        got += [r.to_json() for d in days[3:] for r in m.close_day(d, events(d))]
    assert got == want and all('"coverage"' in r for r in got)
