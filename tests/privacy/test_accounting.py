"""Tests for streamfilter.privacy.accounting.

Oracles, all independent of the code under test:
* a brute-force grid over α of the CKS per-order bound, written in the α form (not the x = α − 1
  form the implementation uses);
* mpmath at 50 digits for the exact CKS infimum (soundness: the reported number may not be on the
  optimistic side of it);
* dp_accounting (test-only dependency): the analytic Gaussian mechanism and its RDP accountant.
"""

from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting import gaussian_mechanism as dp_gaussian
from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.privacy import accounting as acc

RHOS = [1e-6, 1e-4, 1e-3, 0.01, 0.03, 0.1, 0.5, 1.0, 3.0, 10.0, 100.0]
DELTAS = [1e-12, 1e-9, 1e-6, 1e-5, 1e-3, 0.1, 0.5]
EPSILONS = [0.0, 1e-3, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0]


# ------------------------------------------------------------------------------------------------
# oracles
# ------------------------------------------------------------------------------------------------


def cks_log_delta_grid(rho: float, epsilon: float) -> float:
    """min over a two-stage grid of orders of (α−1)(αρ−ε) + α·log(1−1/α) − log(α−1).

    The grid variable is a = α − 1 (α itself cannot resolve orders within 1e-9 of 1), and
    ``log(1−1/α)`` is evaluated as ``log a − log(α)`` to avoid the cancellation in ``1 − 1/α``.
    """

    def objective(a: np.ndarray) -> np.ndarray:
        alpha = 1.0 + a
        log_one_minus_inv_alpha = np.log(a) - np.log1p(a)
        return a * (alpha * rho - epsilon) + alpha * log_one_minus_inv_alpha - np.log(a)

    coarse = np.logspace(-14, 12, 200_001)
    values = objective(coarse)
    i = int(np.argmin(values))
    lo, hi = coarse[max(i - 1, 0)], coarse[min(i + 1, coarse.size - 1)]
    fine = np.linspace(lo, hi, 200_001)
    return float(min(values[i], np.min(objective(fine))))


def mp_bisect(fn, lo: float, hi: float) -> mpmath.mpf:
    """Root of an increasing function by plain bisection at 50 digits (slow but unconditional)."""
    a, b = mpmath.mpf(lo), mpmath.mpf(hi)
    assert fn(a) < 0 < fn(b)
    for _ in range(300):
        mid = (a + b) / 2
        if fn(mid) < 0:
            a = mid
        else:
            b = mid
    return (a + b) / 2


def mp_cks_log_delta(rho: float, epsilon: float) -> mpmath.mpf:
    """The exact infimum (50 digits): root of (2x+1)ρ − ε + log(x/(x+1)) = 0, then (C1)."""
    with mpmath.workdps(50):
        r, e = mpmath.mpf(rho), mpmath.mpf(epsilon)

        def derivative(u):
            x = mpmath.e**u
            return (2 * x + 1) * r - e + mpmath.log(x / (x + 1))

        u = mp_bisect(derivative, -200.0, 200.0)
        x = mpmath.e**u
        return x * ((x + 1) * r - e) + x * mpmath.log(x / (x + 1)) - mpmath.log(1 + x)


def mp_cks_epsilon(rho: float, delta: float) -> mpmath.mpf:
    """Exact CKS ε (50 digits) from (C4) and (C3)."""
    with mpmath.workdps(50):
        r = mpmath.mpf(rho)
        big_l = -mpmath.log(mpmath.mpf(delta))

        def envelope(u):
            x = mpmath.e**u
            return r * x * x + mpmath.log(1 + x) - big_l

        u = mp_bisect(envelope, -200.0, 200.0)
        x = mpmath.e**u
        alpha = x + 1
        eps = alpha * r + (big_l + alpha * mpmath.log(1 - 1 / alpha) - mpmath.log(x)) / x
        return max(eps, mpmath.mpf(0))


# ------------------------------------------------------------------------------------------------
# Corollary 4.7 calibration
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("b_norm", [1e-6, 0.25, 1.0, 4.0, 1e6])
@pytest.mark.parametrize("rho", [1e-8, 0.01, 0.5, 2.0, 1e4])
def test_sigma_for_rho_is_corollary_4_7_and_never_claims_more(b_norm: float, rho: float) -> None:
    sigma = acc.sigma_for_rho(b_norm, rho)
    assert sigma == pytest.approx(math.sqrt(b_norm / (2 * rho)), rel=1e-15)
    assert Fraction(b_norm) / (2 * Fraction(sigma) ** 2) <= Fraction(rho)  # exact
    back = acc.rho_for_sigma(b_norm, sigma)
    assert back <= rho
    assert back == pytest.approx(rho, rel=1e-14)


def test_rho_for_sigma_rounds_up_and_edges() -> None:
    for b_norm, sigma in [(1.0, 3.0), (4.0, 0.1), (0.3, 7.7)]:
        rho = acc.rho_for_sigma(b_norm, sigma)
        assert Fraction(rho) >= Fraction(b_norm) / (2 * Fraction(sigma) ** 2)
    assert acc.rho_for_sigma(1.0, math.inf) == 0.0
    assert acc.rho_for_sigma(1.0, 0.0) == math.inf


# ------------------------------------------------------------------------------------------------
# Theorem 4.9
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("epsilon", EPSILONS)
def test_thm49_rho_is_the_paper_closed_form(epsilon: float, delta: float) -> None:
    log_inv = math.log(1 / delta)
    paper = (math.sqrt(log_inv + epsilon) - math.sqrt(log_inv)) ** 2
    got = acc.rho_from_epsilon_delta_thm49(epsilon, delta)
    assert got == pytest.approx(paper, rel=1e-9, abs=1e-300)
    # and it is exactly the inverse of ε = ρ + 2·sqrt(ρ·log(1/δ)), rounded the safe way
    if got > 0:
        assert acc.epsilon_from_rho_thm49(got, delta) <= epsilon * (1 + 1e-12)
        assert acc.epsilon_from_rho_thm49(got, delta) == pytest.approx(epsilon, rel=1e-12)


@pytest.mark.parametrize("delta", [1e-9, 1e-5, 0.1])
@pytest.mark.parametrize("rho", [1e-4, 0.03, 1.0, 20.0])
def test_thm49_epsilon_is_min_over_alpha_of_fact_2_4(rho: float, delta: float) -> None:
    """ρ-zCDP ⇒ (αρ + log(1/δ)/(α−1), δ)-DP for every α > 1; Thm 4.9 is the minimum."""
    alphas = 1.0 + np.logspace(-8, 8, 400_001)
    grid = float(np.min(alphas * rho + math.log(1 / delta) / (alphas - 1.0)))
    got = acc.epsilon_from_rho_thm49(rho, delta)
    assert got <= grid  # no grid order beats the closed form ...
    assert got == pytest.approx(grid, rel=1e-8)
    with mpmath.workdps(50):  # ... and it is not below the exact minimum, at α = 1 + sqrt(L/ρ)
        big_l = -mpmath.log(mpmath.mpf(delta))
        alpha = 1 + mpmath.sqrt(big_l / rho)
        assert mpmath.mpf(got) >= alpha * rho + big_l / (alpha - 1)


# ------------------------------------------------------------------------------------------------
# CKS (Canonne, Kamath & Steinke 2020, Cor. 13)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rho", "epsilon"),
    [(r, e) for r in [1e-4, 0.01, 0.0306, 0.5, 2.0, 30.0] for e in [0.0, 0.1, 1.0, 3.0, 10.0]],
)
def test_cks_delta_matches_brute_force_grid_and_is_sound(rho: float, epsilon: float) -> None:
    opt = acc.delta_from_rho_epsilon_cks(rho, epsilon)
    log_grid = cks_log_delta_grid(rho, epsilon)
    exact = mp_cks_log_delta(rho, epsilon)
    if log_grid < -700:  # underflows: reported as the smallest positive double, an upper bound
        assert opt == math.nextafter(0.0, 1.0)
        assert exact < -700
        return
    grid = math.exp(log_grid)
    # the optimiser is not beaten by the grid, beyond the explicit upward allowance the reported δ
    # carries for floating-point evaluation error (16 ulps per unit of log-magnitude: < 1e-11) ...
    assert grid >= opt * (1 - 1e-11)
    # ... and is as tight as the grid
    assert (grid - opt) / opt <= 1e-9
    # soundness: never below the exact infimum (compared exactly in mpmath)
    with mpmath.workdps(50):
        assert mpmath.mpf(opt) >= mpmath.e**exact


@pytest.mark.parametrize("delta", [1e-12, 1e-6, 1e-5, 1e-2, 0.3])
@pytest.mark.parametrize("rho", [1e-3, 0.03, 0.5, 5.0, 100.0])
def test_cks_epsilon_is_sound_and_tight_against_mpmath(rho: float, delta: float) -> None:
    got = acc.epsilon_from_rho_cks(rho, delta)
    exact = mp_cks_epsilon(rho, delta)
    with mpmath.workdps(50):
        assert mpmath.mpf(got) >= exact  # never optimistic
        assert float(mpmath.mpf(got) - exact) <= 1e-12 * max(got, 1.0)


@pytest.mark.parametrize("delta", [1e-9, 1e-5, 1e-2])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 4.0])
def test_cks_rho_is_conservative_against_mpmath(epsilon: float, delta: float) -> None:
    rho = acc.rho_from_epsilon_delta_cks(epsilon, delta)
    # mpmath: at this ρ the exact CKS ε does not exceed the target ...
    assert mp_cks_epsilon(rho, delta) <= epsilon
    # ... and slightly more ρ would (tightness)
    assert mp_cks_epsilon(rho * (1 + 1e-9), delta) > epsilon


@pytest.mark.parametrize("delta", [1e-7, 1e-5, 1e-3])
@pytest.mark.parametrize("rho", [1e-3, 0.03, 0.5, 3.0, 50.0])
def test_cks_epsilon_never_above_dp_accounting_rdp_accountant(rho: float, delta: float) -> None:
    """dp_accounting's RDP accountant uses the same per-order formula on a finite order grid, so it
    can only be looser; with a fine grid it is close."""
    sigma = 1.0 / math.sqrt(2.0 * rho)  # Gaussian with sensitivity 1 is (α, α/(2σ²))-RDP
    event = dp_event.GaussianDpEvent(noise_multiplier=sigma)
    default = dp_rdp.RdpAccountant().compose(event).get_epsilon(delta)
    fine_orders = list(1.0 + np.logspace(-3, 5, 20_000))
    fine = dp_rdp.RdpAccountant(orders=fine_orders).compose(event).get_epsilon(delta)
    ours = acc.epsilon_from_rho_cks(rho, delta)
    assert ours <= default * (1 + 1e-9)
    assert ours <= fine * (1 + 1e-9)
    assert ours == pytest.approx(fine, rel=1e-5)


def test_cks_delta_never_above_dp_accounting_compute_delta() -> None:
    orders = np.array(1.0 + np.logspace(-3, 5, 20_000))
    for rho in [0.01, 0.3, 2.0]:
        for epsilon in [0.5, 1.0, 4.0]:
            oracle, _ = dp_rdp.compute_delta(orders, orders * rho, epsilon)
            ours = acc.delta_from_rho_epsilon_cks(rho, epsilon)
            assert ours <= oracle * (1 + 1e-9)
            assert ours == pytest.approx(oracle, rel=1e-5)


# ------------------------------------------------------------------------------------------------
# Gaussian DP (continuous Gaussian)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mu", [0.05, 0.2, 0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.5, 1.0, 2.0, 5.0])
def test_gdp_delta_matches_analytic_gaussian(mu: float, epsilon: float) -> None:
    """N(0, σ²) with sensitivity 1 and σ = 1/μ has exactly the μ-GDP curve."""
    oracle = float(GaussianPrivacyLoss(standard_deviation=1.0 / mu).get_delta_for_epsilon(epsilon))
    ours = acc.delta_from_mu_epsilon_gdp(mu, epsilon)
    if oracle < 1e-12:  # the oracle works with ndtr in linear space; compare where it is accurate
        assert ours <= 1e-11
        return
    assert ours >= oracle * (1 - 1e-12)
    assert ours == pytest.approx(oracle, rel=1e-9)


@pytest.mark.parametrize("delta", [1e-10, 1e-6, 1e-5, 1e-3, 0.1])
@pytest.mark.parametrize("rho", [1e-3, 0.01, 0.0359, 0.1, 0.5, 2.0, 20.0])
def test_gdp_epsilon_against_dp_accounting(rho: float, delta: float) -> None:
    sigma = 1.0 / math.sqrt(2.0 * rho)
    oracle = dp_gaussian.get_epsilon_gaussian(sigma, delta, tol=1e-15)
    ours = acc.epsilon_from_rho_gdp(rho, delta)
    assert ours == pytest.approx(oracle, rel=1e-6, abs=1e-12)
    assert ours >= oracle  # never below the oracle
    # and the oracle's own δ at our ε meets the target
    assert GaussianPrivacyLoss(standard_deviation=sigma).get_delta_for_epsilon(ours) <= delta * (
        1 + 1e-9
    )


@pytest.mark.parametrize("delta", [1e-10, 1e-5, 0.1])
@pytest.mark.parametrize("epsilon", [0.0, 0.1, 1.0, 8.0])
def test_gdp_rho_against_dp_accounting(epsilon: float, delta: float) -> None:
    sigma = dp_gaussian.get_sigma_gaussian(epsilon, delta, tol=1e-15)
    oracle_rho = 1.0 / (2.0 * sigma * sigma)
    ours = acc.rho_from_epsilon_delta_gdp(epsilon, delta)
    assert ours == pytest.approx(oracle_rho, rel=1e-6)
    mu = acc.mu_for_rho(ours)
    assert GaussianPrivacyLoss(standard_deviation=1.0 / mu).get_delta_for_epsilon(
        epsilon
    ) <= delta * (1 + 1e-9)


def test_discrete_gaussian_is_not_mu_gdp_but_is_within_cks() -> None:
    """Why GDP must not be claimed for the discrete Gaussian: for N_Z(0, s²) and a shift of 1 the
    exact hockey-stick δ(ε) exceeds the μ = 1/s GDP curve, while staying under CKS at ρ = 1/(2s²).
    """

    def discrete_delta(s: float, epsilon: float) -> float:
        k = np.arange(-2000, 2001, dtype=float)
        log_w = -(k**2) / (2 * s * s)
        log_z = np.logaddexp.reduce(log_w)
        log_p = log_w - log_z
        log_q = -((k - 1.0) ** 2) / (2 * s * s) - log_z
        diff = np.exp(log_p) - np.exp(epsilon + log_q)
        return float(diff[diff > 0].sum())

    exceeded = False
    for s in [0.5, 1.0, 2.0]:
        for epsilon in [0.0, 1.0, 2.0]:
            exact = discrete_delta(s, epsilon)
            assert exact <= acc.delta_from_rho_epsilon_cks(1 / (2 * s * s), epsilon)
            exceeded |= exact > acc.delta_from_mu_epsilon_gdp(1 / s, epsilon) * (1 + 1e-6)
    assert exceeded


# ------------------------------------------------------------------------------------------------
# round trips and ordering
# ------------------------------------------------------------------------------------------------

ROUND_TRIP = [
    (acc.epsilon_from_rho_thm49, acc.rho_from_epsilon_delta_thm49),
    (acc.epsilon_from_rho_cks, acc.rho_from_epsilon_delta_cks),
    (acc.epsilon_from_rho_gdp, acc.rho_from_epsilon_delta_gdp),
]


@pytest.mark.parametrize(("to_eps", "to_rho"), ROUND_TRIP, ids=["thm49", "cks", "gdp"])
@pytest.mark.parametrize("delta", [1e-300, 1e-12, 1e-5, 0.5, 1 - 1e-12])
def test_round_trip_rho_eps_rho(to_eps, to_rho, delta: float) -> None:
    for rho in [0.0, 1e-9, *RHOS, 1e4, 1e6]:
        epsilon = to_eps(rho, delta)
        assert epsilon >= 0.0
        back = to_rho(epsilon, delta)
        if epsilon == 0.0:
            # (0, δ)-DP region: ρ is not identifiable from ε, only ρ <= ρ(0, δ)
            assert rho <= back * (1 + 1e-9)
            continue
        # ε near 0 is a difference of much larger terms, so ρ is recovered less precisely there
        assert back == pytest.approx(rho, rel=1e-9 if epsilon > 1e-3 else 1e-6, abs=0)
        # conservative composition: the ε implied by the returned ρ never exceeds what we had
        assert to_eps(back, delta) <= epsilon * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize(("to_eps", "to_rho"), ROUND_TRIP, ids=["thm49", "cks", "gdp"])
@pytest.mark.parametrize("delta", [1e-300, 1e-12, 1e-5, 0.5, 1 - 1e-12])
def test_round_trip_eps_rho_eps(to_eps, to_rho, delta: float) -> None:
    for epsilon in [*EPSILONS, 50.0, 1e3]:
        rho = to_rho(epsilon, delta)
        assert rho >= 0.0
        again = to_eps(rho, delta)
        assert again <= epsilon * (1 + 1e-9) + 1e-12
        if rho > 0 and epsilon > 0:
            # δ → 1 is badly conditioned (ε barely moves with ρ); still conservative there
            assert again == pytest.approx(epsilon, rel=1e-9 if delta < 0.9 else 1e-6)


@pytest.mark.parametrize("delta", DELTAS)
def test_tighter_conversions_are_tighter(delta: float) -> None:
    for rho in RHOS:
        thm49 = acc.epsilon_from_rho_thm49(rho, delta)
        cks = acc.epsilon_from_rho_cks(rho, delta)
        gdp = acc.epsilon_from_rho_gdp(rho, delta)
        assert gdp <= cks * (1 + 1e-12) + 1e-300
        assert cks <= thm49 * (1 + 1e-12)


def test_sigma_ratio_design_claim() -> None:
    """docs/design.md §2: at ε=1, δ=1e-5 the three give σ in the ratio 1 : 0.825 : 0.761."""
    b_norm = 4.0
    sigma = {
        name: acc.sigma_for_rho(b_norm, fn(1.0, 1e-5))
        for name, fn in [
            ("thm49", acc.rho_from_epsilon_delta_thm49),
            ("cks", acc.rho_from_epsilon_delta_cks),
            ("gdp", acc.rho_from_epsilon_delta_gdp),
        ]
    }
    assert round(sigma["cks"] / sigma["thm49"], 3) == 0.825
    assert round(sigma["gdp"] / sigma["thm49"], 3) == 0.761


# ------------------------------------------------------------------------------------------------
# edge cases
# ------------------------------------------------------------------------------------------------


def test_rho_zero_and_epsilon_zero() -> None:
    for delta in [1e-9, 0.5]:
        assert acc.epsilon_from_rho_thm49(0.0, delta) == 0.0
        assert acc.epsilon_from_rho_cks(0.0, delta) == 0.0
        assert acc.epsilon_from_rho_gdp(0.0, delta) == 0.0
        assert acc.rho_from_epsilon_delta_thm49(0.0, delta) == 0.0
    assert acc.delta_from_rho_epsilon_cks(0.0, 0.0) == 0.0
    assert acc.delta_from_mu_epsilon_gdp(0.0, 0.0) == 0.0
    # ε = 0 is still achievable with δ > 0: (0, δ)-DP for small ρ
    assert acc.rho_from_epsilon_delta_cks(0.0, 1e-5) > 0.0
    # (0, δ)-DP of a μ-GDP mechanism: δ = 2Φ(μ/2) − 1, so μ = 2Φ⁻¹((1+δ)/2) ≈ sqrt(2π)·δ
    rho_gdp = acc.rho_from_epsilon_delta_gdp(0.0, 1e-5)
    assert math.sqrt(2 * rho_gdp) == pytest.approx(math.sqrt(2 * math.pi) * 1e-5, rel=1e-6)
    # TV of CKS at ε = 0 is a valid bound for the Gaussian, so it is larger than the exact one
    assert acc.delta_from_rho_epsilon_cks(0.5, 0.0) > acc.delta_from_mu_epsilon_gdp(1.0, 0.0)
    assert acc.delta_from_rho_epsilon_cks(0.5, math.inf) == 0.0
    assert acc.delta_from_mu_epsilon_gdp(1.0, math.inf) == 0.0


@pytest.mark.parametrize("rho", [1e-300, 1e-200, 1e6, 1e12, 1e50, 1e99])
def test_extreme_rho_is_finite_ordered_and_never_nan(rho: float) -> None:
    for delta in [1e-300, 1e-5, 0.5]:
        values = [
            acc.epsilon_from_rho_thm49(rho, delta),
            acc.epsilon_from_rho_cks(rho, delta),
            acc.epsilon_from_rho_gdp(rho, delta),
        ]
        assert all(math.isfinite(v) and v >= 0 for v in values)
        assert values[2] <= values[1] * (1 + 1e-12) + 1e-300
        assert values[1] <= values[0] * (1 + 1e-12)
    for epsilon in [0.0, 1.0, 1e3]:
        d = acc.delta_from_rho_epsilon_cks(rho, epsilon)
        assert 0.0 < d <= 1.0


def test_beyond_rho_max_reports_no_privacy() -> None:
    assert acc.epsilon_from_rho_cks(10 * acc.RHO_MAX, 1e-5) == math.inf
    assert acc.epsilon_from_rho_gdp(10 * acc.RHO_MAX, 1e-5) == math.inf
    assert acc.delta_from_rho_epsilon_cks(10 * acc.RHO_MAX, 1.0) == 1.0
    # the inverse is never below Theorem 4.9's (also certified) ρ
    assert acc.rho_from_epsilon_delta_cks(1e300, 1e-5) >= acc.rho_from_epsilon_delta_thm49(
        1e300, 1e-5
    )


def test_underflowing_delta_is_reported_as_smallest_positive() -> None:
    assert acc.delta_from_rho_epsilon_cks(1e-4, 1e3) == math.nextafter(0.0, 1.0)
    assert acc.delta_from_mu_epsilon_gdp(0.01, 1e3) == math.nextafter(0.0, 1.0)


# ------------------------------------------------------------------------------------------------
# calibration and the guarantee
# ------------------------------------------------------------------------------------------------


def test_calibrate_rho_uses_the_tightest_sound_method() -> None:
    rho_g, method_g = acc.calibrate_rho(1.0, 1e-5, "gaussian")
    rho_d, method_d = acc.calibrate_rho(1.0, 1e-5, "discrete_gaussian")
    assert method_g == "gdp"
    assert method_d == "cks"
    assert rho_g == acc.rho_from_epsilon_delta_gdp(1.0, 1e-5)
    assert rho_d == acc.rho_from_epsilon_delta_cks(1.0, 1e-5)
    assert rho_g > rho_d


@pytest.mark.parametrize("mechanism", ["gaussian", "discrete_gaussian"])
def test_guarantee(mechanism: str) -> None:
    b_norm, rho, delta = 4.0, 0.5, 1e-6
    sigma = acc.sigma_for_rho(b_norm, rho)
    g = acc.guarantee(b_norm, rho, sigma, mechanism, delta)  # type: ignore[arg-type]
    assert (g.rho, g.sigma, g.b_norm, g.mechanism, g.delta) == (
        rho,
        sigma,
        b_norm,
        mechanism,
        delta,
    )
    expected_methods = {"thm49", "cks", "gdp"} if mechanism == "gaussian" else {"thm49", "cks"}
    assert set(g.epsilon_by_method) == expected_methods
    assert g.method == ("gdp" if mechanism == "gaussian" else "cks")
    assert g.epsilon == g.epsilon_by_method[g.method] == min(g.epsilon_by_method.values())
    assert g.epsilon_by_method["cks"] == acc.epsilon_from_rho_cks(rho, delta)
    assert g.epsilon_by_method["thm49"] == acc.epsilon_from_rho_thm49(rho, delta)
    payload = g.to_json_dict()
    assert {"rho", "sigma", "b_norm", "mechanism", "delta", "epsilon", "method"} <= set(payload)
    assert json.loads(json.dumps(payload))["epsilon_by_method"] == dict(g.epsilon_by_method)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.rho = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        g.epsilon_by_method["cks"] = 0.0  # type: ignore[index]


def test_guarantee_checks_sigma_against_rho() -> None:
    sigma = acc.sigma_for_rho(4.0, 0.5)
    # a larger σ is fine: the claim is conservative
    assert acc.guarantee(4.0, 0.5, 2 * sigma, "gaussian", 1e-6).rho == 0.5
    with pytest.raises(ValueError, match=r"sigma=1\.0 is too small for rho=0\.5"):
        acc.guarantee(4.0, 0.5, 1.0, "gaussian", 1e-6)
    # float slack from a lattice round trip: the larger implied ρ is reported, never the smaller
    slightly_small = math.nextafter(sigma, 0.0)
    g = acc.guarantee(4.0, 0.5, slightly_small, "discrete_gaussian", 1e-6)
    assert g.rho >= 0.5
    assert Fraction(g.rho) >= Fraction(4.0) / (2 * Fraction(slightly_small) ** 2)


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: acc.epsilon_from_rho_cks(0.5, 1.5), "delta must be in (0, 1), got delta=1.5"),
        (lambda: acc.epsilon_from_rho_cks(0.5, 0.0), "delta must be in (0, 1), got delta=0.0"),
        (lambda: acc.epsilon_from_rho_gdp(0.5, 1.0), "delta must be in (0, 1), got delta=1.0"),
        (
            lambda: acc.epsilon_from_rho_thm49(-1.0, 1e-5),
            "rho must be finite and >= 0, got rho=-1.0",
        ),
        (lambda: acc.epsilon_from_rho_cks(math.nan, 1e-5), "rho must not be NaN"),
        (
            lambda: acc.epsilon_from_rho_cks(math.inf, 1e-5),
            "rho must be finite and >= 0, got rho=inf",
        ),
        (
            lambda: acc.rho_from_epsilon_delta_cks(-0.1, 1e-5),
            "epsilon must be finite and >= 0, got epsilon=-0.1",
        ),
        (
            lambda: acc.rho_from_epsilon_delta_gdp(1.0, -1e-5),
            "delta must be in (0, 1), got delta=-1e-05",
        ),
        (
            lambda: acc.delta_from_rho_epsilon_cks(0.5, -1.0),
            "epsilon must be >= 0, got epsilon=-1.0",
        ),
        (
            lambda: acc.delta_from_mu_epsilon_gdp(-1.0, 1.0),
            "mu must be finite and >= 0, got mu=-1.0",
        ),
        (lambda: acc.sigma_for_rho(0.0, 0.5), "b_norm must be finite and > 0, got b_norm=0.0"),
        (lambda: acc.sigma_for_rho(4.0, 0.0), "rho must be finite and > 0, got rho=0.0"),
        (lambda: acc.rho_for_sigma(4.0, -1.0), "sigma must be >= 0, got sigma=-1.0"),
        (
            lambda: acc.epsilon_from_rho_cks("0.5", 1e-5),  # type: ignore[arg-type]
            "rho must be a real number, got rho='0.5'",
        ),
        (lambda: acc.epsilon_from_rho_cks(True, 1e-5), "rho must be a real number, got rho=True"),
        (
            lambda: acc.calibrate_rho(1.0, 1e-5, "laplace"),  # type: ignore[arg-type]
            "mechanism must be one of discrete_gaussian, gaussian, got mechanism='laplace'",
        ),
        (
            lambda: acc.guarantee(4.0, 0.5, 2.0, "gaussian", 2.0),
            "delta must be in (0, 1), got delta=2.0",
        ),
    ],
)
def test_validation_messages_name_the_value(call, message: str) -> None:
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)


# ------------------------------------------------------------------------------------------------
# monotonicity (hypothesis)
# ------------------------------------------------------------------------------------------------

rhos = st.floats(min_value=1e-6, max_value=100.0)
deltas = st.floats(min_value=1e-12, max_value=0.5)
epsilons = st.floats(min_value=0.0, max_value=20.0)
TO_EPS = [acc.epsilon_from_rho_thm49, acc.epsilon_from_rho_cks, acc.epsilon_from_rho_gdp]


@settings(max_examples=60, deadline=None)
@given(rho_a=rhos, rho_b=rhos, delta=deltas)
def test_epsilon_non_decreasing_in_rho(rho_a: float, rho_b: float, delta: float) -> None:
    lo, hi = sorted((rho_a, rho_b))
    for fn in TO_EPS:
        assert fn(lo, delta) <= fn(hi, delta) * (1 + 1e-12) + 1e-300


@settings(max_examples=60, deadline=None)
@given(rho=rhos, delta_a=deltas, delta_b=deltas)
def test_epsilon_non_increasing_in_delta(rho: float, delta_a: float, delta_b: float) -> None:
    lo, hi = sorted((delta_a, delta_b))
    for fn in TO_EPS:
        assert fn(rho, hi) <= fn(rho, lo) * (1 + 1e-12) + 1e-300


@settings(max_examples=60, deadline=None)
@given(rho=rhos, eps_a=epsilons, eps_b=epsilons)
def test_delta_non_increasing_in_epsilon(rho: float, eps_a: float, eps_b: float) -> None:
    lo, hi = sorted((eps_a, eps_b))
    assert acc.delta_from_rho_epsilon_cks(rho, hi) <= acc.delta_from_rho_epsilon_cks(rho, lo) * (
        1 + 1e-12
    )
    mu = math.sqrt(2 * rho)
    assert acc.delta_from_mu_epsilon_gdp(mu, hi) <= acc.delta_from_mu_epsilon_gdp(mu, lo) * (
        1 + 1e-12
    )


@settings(max_examples=40, deadline=None)
@given(epsilon=epsilons, delta=deltas)
def test_calibrated_rho_meets_the_target(epsilon: float, delta: float) -> None:
    for mechanism in ("gaussian", "discrete_gaussian"):
        rho, method = acc.calibrate_rho(epsilon, delta, mechanism)
        if method == "gdp":
            assert acc.epsilon_from_rho_gdp(rho, delta) <= epsilon * (1 + 1e-9) + 1e-12
        else:
            assert acc.delta_from_rho_epsilon_cks(rho, epsilon) <= delta * (1 + 1e-9)
