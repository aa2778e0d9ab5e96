"""The empirical privacy audit (docs/design.md §6 item 12): sound on the correct build, and it catches
each deliberately injected bug.

The audit runs the real engine with OS CSPRNG noise, so these tests are statistical. Their
margins are wide: on the default configuration (claimed ε ≈ 2.04 at δ = 0.05) the correct build
gives ε_lb ≈ 1.1–1.4 with 4,000–10,000 trials (it can exceed the claim only with probability
≤ α = 5% even at the boundary, and this configuration is far inside), ``sigma_halved`` gives
≈ 3.5, and the two filter bugs ≥ 5.
"""

import json
import math
import os
from fractions import Fraction

import numpy as np
import pytest

import streamfilter.engine.day as day_module
from streamfilter import Monitor
from streamfilter.privacy.accounting import epsilon_from_rho_cks
from streamfilter.verify.audit import (
    BUGS,
    AuditConfig,
    _cp_upper,
    _epsilon_lb,
    _injected,
    audit,
    main,
)
from tests.support import oracle

WORKERS = 2 if (os.cpu_count() or 1) >= 2 else 1
CONFIG = AuditConfig()


# ---------------------------------------------------------------------------- the statistics


def test_clopper_pearson_upper_bound_matches_closed_forms():
    n, level = 1000, 0.025
    # zero successes: (1 − p)^n = level
    assert _cp_upper(np.array([0]), n, level)[0] == pytest.approx(1 - level ** (1 / n), rel=1e-9)
    # all successes: the trivial bound
    assert _cp_upper(np.array([n]), n, level)[0] == 1.0
    # monotone in k, and above the point estimate
    ks = np.arange(0, n + 1, 50)
    ub = _cp_upper(ks, n, level)
    assert np.all(np.diff(ub) > 0)
    assert np.all(ub >= ks / n)


def test_epsilon_lower_bound_formula():
    n = 10_000
    eps, fpr_ub, fnr_ub = _epsilon_lb(np.array([10]), n, np.array([5000]), n, 1e-5, 0.05)
    expected = max(
        math.log((1 - 1e-5 - fnr_ub[0]) / fpr_ub[0]), math.log((1 - 1e-5 - fpr_ub[0]) / fnr_ub[0])
    )
    assert eps[0] == pytest.approx(expected)
    assert fpr_ub[0] > 10 / n and fnr_ub[0] > 0.5
    # no signal: both rates ~1/2 → the bound is (close to) zero or negative
    eps, _, _ = _epsilon_lb(np.array([5000]), n, np.array([5000]), n, 1e-5, 0.05)
    assert eps[0] < 0.1


def test_claimed_epsilon_is_the_cks_epsilon_of_the_integer_budget_and_variance():
    params = CONFIG.params()
    rho = params.budget_units / (2 * params.sigma2_units)
    assert rho <= CONFIG.rho
    assert epsilon_from_rho_cks(rho, CONFIG.delta) == pytest.approx(
        epsilon_from_rho_cks(params.rho_effective, CONFIG.delta)
    )
    assert 1.0 <= epsilon_from_rho_cks(rho, CONFIG.delta) <= 2.5


# ---------------------------------------------------------------------------- the injections


def _originals():
    return day_module.filter_totals, day_module.noisy_release


@pytest.mark.parametrize(
    "bug",
    [b for b in BUGS if b not in ("coverage_sensitivity_ignored", "population_noise_per_node")],
)
def test_injection_is_scoped_and_restored(bug):
    before = _originals()
    with _injected(bug):
        assert _originals() != before
    assert _originals() == before
    with pytest.raises(RuntimeError), _injected(bug):
        raise RuntimeError("boom")
    assert _originals() == before


def test_unknown_bug_is_refused():
    with pytest.raises(ValueError):
        audit(CONFIG, 10, bug="no_such_bug")  # type: ignore[arg-type]
    with pytest.raises(ValueError), _injected("no_such_bug"):
        pass


def _one_user_run(values, clip, b_norm=1.0, days=1):
    m = Monitor(b_norm=b_norm, rho=1e6, granularity=2.0**-10, test_seed=7)
    m.add_query(
        {"query_id": "q", "kind": "sum", "features": ["x"], "clip": clip, "from_day": "2026-01-01"}
    )
    out = []
    for k in range(days):
        day = f"2026-01-0{k + 1}"
        out += m.close_day(day, [{"user_id": "u", "day": day, "values": values}])
    return m, out


def test_check_before_add_bug_admits_a_contribution_larger_than_the_budget():
    m, rel = _one_user_run({"x": 4.0}, clip=4.0, b_norm=1.0)
    assert m.spent("u") == 0.0 and abs(rel[0].value[0]) < 0.05  # refused: cost 16 > B = 1
    with _injected("check_before_add_ignored"):
        m, rel = _one_user_run({"x": 4.0}, clip=4.0, b_norm=1.0)
    assert m.spent("u") == 16.0 and abs(rel[0].value[0] - 4.0) < 0.05


def test_cost_before_clip_bug_adds_the_unclipped_vector_at_the_clipped_cost():
    m, rel = _one_user_run({"x": 8.0}, clip=1.0, b_norm=1.0)
    assert m.spent("u") == 1.0 and abs(rel[0].value[0] - 1.0) < 0.05
    with _injected("cost_before_clip"):
        m, rel = _one_user_run({"x": 8.0}, clip=1.0, b_norm=1.0)
    assert m.spent("u") == 1.0 and abs(rel[0].value[0] - 8.0) < 0.05


def test_sigma_halved_bug_draws_half_the_noise_and_reports_the_configured_sigma():
    """The oracle, from the configuration: σ² = B_norm/(2ρ) = 1 (Corollary 4.7), drawn as
    ``N_Z(0, s²)`` lattice units with ``s² = ceil(σ²/γ²)`` = 256, i.e. variance ``s²γ²`` in data
    units. 4000 empty bins pass a two-sided χ² check against it (a σ off by √2 either way fails
    with probability ≥ 0.999); under the injected bug they pass it against a quarter of it."""

    def noise():
        m = Monitor(b_norm=1.0, rho=0.5, granularity=2.0**-4, test_seed=3)
        m.add_query(
            {
                "query_id": "h",
                "kind": "histogram",
                "feature": "c",
                "categories": [str(i) for i in range(4000)],
                "clip": 1.0,
                "from_day": "2026-01-01",
            }
        )
        (rel,) = m.close_day("2026-01-01", [])
        return np.array(rel.value), rel.sigma

    gamma = 2.0**-4
    s2 = math.ceil(Fraction(1.0) / (2 * Fraction(0.5)) / Fraction(gamma) ** 2)
    variance = oracle.discrete_gaussian_variance(s2) * gamma**2
    values, reported = noise()
    oracle.assert_variance(values, variance, checks=2)
    assert reported == pytest.approx(math.sqrt(variance), rel=1e-9)
    with _injected("sigma_halved"):
        values_bug, reported_bug = noise()
    assert reported_bug == reported
    oracle.assert_variance(values_bug, variance / 4, checks=2)


# ---------------------------------------------------------------------------- the audit itself


def test_small_audit_reports_a_consistent_result():
    r = audit(CONFIG, 400, workers=1)
    assert r.trials == 400 and r.eval_trials_per_world == 200
    assert r.delta == CONFIG.delta and r.bug is None
    assert r.canary_spent_fraction == 1.0  # the canary spends exactly its whole budget
    assert 0.0 <= r.epsilon_lower_bound < r.epsilon_claimed
    assert r.epsilon_claimed == pytest.approx(
        epsilon_from_rho_cks(CONFIG.params().rho_effective, CONFIG.delta)
    )
    assert len(r.weights) == 3  # q on day 1, q and big on day 2
    assert json.loads(json.dumps(r.to_json_dict()))["violation"] is False


@pytest.mark.slow
@pytest.mark.parametrize(
    "config",
    [
        AuditConfig(exhaustion="retire"),
        AuditConfig(exhaustion="clip"),
        AuditConfig(mechanism="gaussian"),
        AuditConfig(days=3, rho=0.25, delta=0.01),
    ],
    ids=["retire", "clip", "gaussian", "3-days"],
)
def test_audit_of_other_configurations_finds_no_violation(config):
    r = audit(config, 2000, workers=WORKERS)
    assert r.canary_spent_fraction == 1.0
    assert not r.violation, r.to_json_dict()


@pytest.mark.slow
def test_audit_of_the_correct_build_never_exceeds_the_claim():
    r = audit(CONFIG, 10_000, workers=WORKERS)
    assert not r.violation, r.to_json_dict()
    # and the audit is not vacuous: it does see the canary
    assert r.epsilon_lower_bound > 0.5, r.to_json_dict()


@pytest.mark.slow
def test_audit_catches_sigma_halved():
    r = audit(CONFIG, 10_000, bug="sigma_halved", workers=WORKERS)
    assert r.violation, r.to_json_dict()
    assert r.epsilon_lower_bound > r.epsilon_claimed + 0.5, r.to_json_dict()


@pytest.mark.parametrize("bug", ["check_before_add_ignored", "cost_before_clip"])
def test_audit_catches_the_filter_bugs(bug):
    r = audit(CONFIG, 4000, bug=bug, workers=WORKERS)
    assert r.violation, r.to_json_dict()
    assert r.epsilon_lower_bound > r.epsilon_claimed + 2.0, r.to_json_dict()


def test_command_line_prints_the_result_as_json(capsys):
    assert main(["--trials", "200", "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trials"] == 200 and out["violation"] is False
    assert {"epsilon_lower_bound", "epsilon_claimed", "delta", "threshold"} <= out.keys()


# ---------------------------------------------------------------------------------- coverage
COVERAGE = AuditConfig(coverage_rho=0.05)


def test_audit_with_coverage_recomputes_its_accounting_and_adds_it_to_the_claim():
    """The audited engine runs the coverage tracker; its released estimates join the values the
    test may use, the accounting is recomputed over every epoch (exact rationals) and the claim
    is the composition ρ + ρ_cov."""
    r = audit(COVERAGE, 400, workers=1)
    assert r.coverage is not None and r.coverage["ok"] is True
    assert r.coverage["streams"] == 9  # 8 thresholds floor(B/2^k), B = 512 units, + counted
    assert 0 < r.coverage["rho_recomputed"] <= 0.05 and r.coverage["epochs_checked"] == 31
    rho = COVERAGE.params().rho_effective
    assert r.rho_claimed == pytest.approx(rho + 0.05)
    assert r.epsilon_claimed == pytest.approx(epsilon_from_rho_cks(rho + 0.05, CONFIG.delta))
    assert len(r.weights) == 3 + 2 * 3  # each query release adds covered and counted users
    assert not r.violation, r.to_json_dict()


def test_audit_catches_coverage_noise_calibrated_for_one_stream():
    """A tracker whose noise is calibrated for 1 count stream instead of m: the recomputed
    accounting exceeds the claim by the factor m — a violation with certainty."""
    r = audit(COVERAGE, 40, bug="coverage_sensitivity_ignored", workers=1)
    assert r.coverage is not None and r.coverage["ok"] is False
    m = r.coverage["streams"]
    assert r.coverage["rho_recomputed"] > (m - 1) * 0.05
    assert r.violation
    with pytest.raises(ValueError, match="needs coverage_rho"):
        audit(CONFIG, 40, bug="coverage_sensitivity_ignored")


@pytest.mark.slow
def test_audit_of_the_build_with_coverage_never_exceeds_the_claim():
    r = audit(COVERAGE, 10_000, workers=WORKERS)
    assert not r.violation, r.to_json_dict()
    assert r.epsilon_lower_bound > 0.5, r.to_json_dict()
