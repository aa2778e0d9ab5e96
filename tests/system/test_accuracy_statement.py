"""Each release and ``guarantee`` state Corollary 4.7's ℓ∞ bound for the
active set at a stated failure probability, beside σ and the 95% half-width."""

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from streamfilter import Monitor
from streamfilter.privacy.accuracy import linf_bound, linf_bound_for_variance
from tests.support import oracle
from tests.support.cli import cli

HIST = {
    "query_id": "plans",
    "kind": "histogram",
    "feature": "plan",
    "categories": ["free", "pro", "team"],
    "clip": 1.0,
    "from_day": "2026-01-01",
}


def test_the_bound_is_corollary_4_7_for_the_calibrated_variance():
    for b, rho, d in ((4.0, 0.5, 1), (10.0, 0.0244, 3), (1.0, 2.0, 16)):
        for mech in ("gaussian", "discrete_gaussian"):
            ours = linf_bound_for_variance(b / (2 * rho), d, 0.05, mechanism=mech)
            assert ours == pytest.approx(linf_bound(b, rho, d, 0.05, mechanism=mech), rel=1e-12)


def test_each_release_draws_the_calibrated_noise_and_states_the_bound_it_holds():
    """400 seeded days of a 3-bin histogram whose exact answer is known (every user stays
    active: cost 1 a day, huge budget).

    The oracle, from the configuration alone: σ² = B_norm/(2ρ) (Corollary 4.7) = 10⁶; the
    discrete Gaussian draws ``N_Z(0, s²)`` lattice units with ``s² = ceil(σ²/γ²)`` (CKS 2020),
    i.e. variance ``s²γ²`` in data units. The 1200 errors pass a two-sided χ² check against it
    (α = 10⁻³ shared with the mean check): a correct mechanism passes with probability ≥ 0.999, a
    σ off by √2 either way fails with probability ≥ 0.999. The stated bound is Corollary 4.7's
    ``σ·sqrt(2·log(2d/β))`` for that σ, and it fails in at most β of the releases (a tail bound:
    ~0.6% expected here)."""
    b_norm, rho, gamma, d, beta = 1e6, 0.5, 2.0**-10, 3, 0.05
    m = Monitor(b_norm=b_norm, rho=rho, granularity=gamma, test_seed=5)
    m.add_query(HIST)
    s2 = math.ceil(Fraction(b_norm) / (2 * Fraction(rho)) / Fraction(gamma) ** 2)
    variance = oracle.discrete_gaussian_variance(s2) * gamma**2
    bound = math.sqrt(s2 * gamma**2) * math.sqrt(2 * math.log(2 * d / beta))
    exact = np.array([3.0, 2.0, 1.0])
    plans = ["free"] * 3 + ["pro"] * 2 + ["team"]
    misses, errors = 0, []
    for n in range(400):
        day = (np.datetime64("2026-01-01") + n).astype(str)
        events = [
            {"user_id": f"u{i}", "day": day, "values": {"plan": p}} for i, p in enumerate(plans)
        ]
        (rel,) = m.close_day(day, events)
        assert rel.linf_failure_probability == beta
        assert rel.linf_bound == pytest.approx(bound, rel=1e-9)
        error = np.array(rel.value) - exact
        errors.append(error)
        misses += np.max(np.abs(error)) > rel.linf_bound
    oracle.assert_mean_zero(np.concatenate(errors), variance, checks=2)
    oracle.assert_variance(np.concatenate(errors), variance, checks=2)
    assert misses <= beta * 400
    assert json.loads(rel.to_json())["linf_bound"] == rel.linf_bound


def test_guarantee_states_the_bound(tmp_path):
    (tmp_path / "c.toml").write_text("[privacy]\nb_norm = 4.0\nepsilon = 1.0\ndelta = 1e-6\n")
    out = json.loads(cli("guarantee", "--config", "c.toml", "--json", cwd=tmp_path).stdout)
    assert out["linf_failure_probability"] == 0.05
    assert out["linf_bound_d1"] >= linf_bound(
        4.0, out["rho"], 1, 0.05, mechanism="discrete_gaussian"
    )
    text = cli("guarantee", "--config", "c.toml", cwd=tmp_path).stdout
    assert f"accuracy (Corollary 4.7): each answer is within {out['linf_bound_d1']:.6g}" in text


def test_the_report_states_the_bound_of_each_query(tmp_path):
    from streamfilter.cli.report import ReportData, render_report
    from streamfilter.config import load_config

    (tmp_path / "c.toml").write_text("[privacy]\nb_norm = 4.0\nrho = 0.5\n")
    m = Monitor(b_norm=4.0, rho=0.5, test_seed=2)
    m.add_query(HIST)
    days = ["2026-01-01", "2026-01-02"]
    for day in days:
        m.close_day(day, [{"user_id": "u", "day": day, "values": {"plan": "pro"}}])
    data = ReportData(releases=m.releases, days=days, days_source="test")
    page = render_report(load_config(tmp_path / "c.toml"), data)
    bound = m.releases[-1].linf_bound
    assert 'class="linf"' in page and "(Corollary 4.7)" in page
    assert f"{bound:.4g}"[:4] in page.split('class="linf"', 1)[1][:80]
