"""Tests for streamfilter.privacy.accuracy and streamfilter.privacy.odometer."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import ndtr

from streamfilter.privacy.accounting import epsilon_from_rho_cks, epsilon_from_rho_gdp
from streamfilter.privacy.accuracy import gaussian_halfwidth, linf_bound
from streamfilter.privacy.odometer import UserLoss, discretised_odometer, user_loss


def discrete_gaussian_abs_tail(s: float, lam: float) -> float:
    """P[|X| > λ] for X ~ N_Z(0, s²), by direct summation in log space."""
    k = np.arange(-int(60 * s) - 60, int(60 * s) + 61, dtype=float)
    log_w = -(k**2) / (2 * s * s)
    log_p = log_w - np.logaddexp.reduce(log_w)
    return float(np.exp(log_p[np.abs(k) > lam]).sum())


# ------------------------------------------------------------------------------------------------
# linf_bound (Corollary 4.7)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("b_norm", [0.5, 4.0])
@pytest.mark.parametrize("rho", [0.01, 0.5, 3.0])
@pytest.mark.parametrize("d", [1, 3, 1000])
@pytest.mark.parametrize("delta", [1e-9, 0.05])
def test_linf_bound_is_corollary_4_7(b_norm: float, rho: float, d: int, delta: float) -> None:
    got = linf_bound(b_norm, rho, d, delta)
    expected = math.sqrt(b_norm * math.log(d / delta) / rho)
    assert expected <= got <= expected * (1 + 1e-15)
    discrete = linf_bound(b_norm, rho, d, delta, mechanism="discrete_gaussian")
    assert discrete == pytest.approx(math.sqrt(b_norm * math.log(2 * d / delta) / rho), rel=1e-15)


@pytest.mark.parametrize("d", [1, 5, 100])
@pytest.mark.parametrize("delta", [1e-6, 0.01, 0.2])
def test_linf_bound_holds_for_the_continuous_gaussian(d: int, delta: float) -> None:
    """P[max_j |Z_j| > λ] = 1 − (1 − 2Q(λ/σ))^d <= δ with σ² = B_norm/(2ρ)."""
    b_norm, rho = 4.0, 0.5
    sigma = math.sqrt(b_norm / (2 * rho))
    lam = linf_bound(b_norm, rho, d, delta)
    tail = 2 * float(ndtr(-lam / sigma))
    failure = -math.expm1(d * math.log1p(-tail))
    assert failure <= delta


@pytest.mark.parametrize("s", [0.3, 0.5, 0.8, 1.0, 2.0, 7.5])
@pytest.mark.parametrize("d", [1, 4])
@pytest.mark.parametrize("delta", [0.02, 0.1, 0.2, 0.3])
def test_linf_bound_holds_for_the_discrete_gaussian(s: float, d: int, delta: float) -> None:
    b_norm = 1.0
    rho = b_norm / (2 * s * s)  # σ = s: lattice step 1
    lam = linf_bound(b_norm, rho, d, delta, mechanism="discrete_gaussian")
    tail = discrete_gaussian_abs_tail(s, lam)
    failure = -math.expm1(d * math.log1p(-tail))
    assert failure <= delta


def test_continuous_formula_fails_for_a_small_discrete_gaussian() -> None:
    """Why the discrete mechanism gets log(2d/δ): at s = 0.5 the Cor. 4.7 radius for δ ≈ 0.136
    is 0.999 < 1, and P[|X| >= 1] ≈ 0.213 > δ."""
    s, d = 0.5, 1
    delta = math.exp(-(0.999**2) / (2 * s * s))
    rho = 1.0 / (2 * s * s)
    lam = linf_bound(1.0, rho, d, delta)
    assert lam < 1.0
    assert discrete_gaussian_abs_tail(s, lam) > delta
    lam_discrete = linf_bound(1.0, rho, d, delta, mechanism="discrete_gaussian")
    assert discrete_gaussian_abs_tail(s, lam_discrete) <= delta


# ------------------------------------------------------------------------------------------------
# gaussian_halfwidth
# ------------------------------------------------------------------------------------------------


def test_gaussian_halfwidth() -> None:
    assert gaussian_halfwidth(1.0) == pytest.approx(1.959963984540054, rel=1e-14)
    assert gaussian_halfwidth(3.0, 0.95) == pytest.approx(3 * 1.959963984540054, rel=1e-14)
    assert gaussian_halfwidth(0.0) == 0.0
    for coverage in [0.5, 0.9, 0.99, 0.999999]:
        h = gaussian_halfwidth(2.0, coverage)
        assert float(ndtr(h / 2.0) - ndtr(-h / 2.0)) == pytest.approx(coverage, rel=1e-12)


# ------------------------------------------------------------------------------------------------
# user_loss
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["gaussian", "discrete_gaussian"])
def test_user_loss(mechanism: str) -> None:
    gamma = 2.0**-10
    spent_units, sigma2_units, delta = 3 * 2**20 + 7, 5 * 2**20 + 1, 1e-6
    loss = user_loss(spent_units, gamma, sigma2_units, delta, mechanism)  # type: ignore[arg-type]
    assert isinstance(loss, UserLoss)
    assert loss.spent_units == spent_units
    assert loss.spent == spent_units * gamma**2  # exact: γ is a power of two
    exact_rho = Fraction(spent_units, 2 * sigma2_units)
    assert Fraction(loss.rho_spent) >= exact_rho  # rounded up ...
    assert Fraction(math.nextafter(loss.rho_spent, 0.0)) < exact_rho  # ... by less than an ulp
    if mechanism == "gaussian":
        assert loss.method == "gdp"
        assert loss.epsilon_spent == epsilon_from_rho_gdp(loss.rho_spent, delta)
    else:
        assert loss.method == "cks"
        assert loss.epsilon_spent == epsilon_from_rho_cks(loss.rho_spent, delta)
    assert loss.delta == delta
    with pytest.raises(dataclasses.FrozenInstanceError):
        loss.rho_spent = 0.0  # type: ignore[misc]


def test_user_loss_nothing_spent_and_non_dyadic_granularity() -> None:
    zero = user_loss(0, 2.0**-10, 1000, 1e-6, "discrete_gaussian")
    assert (zero.spent, zero.rho_spent, zero.epsilon_spent) == (0.0, 0.0, 0.0)
    odd = user_loss(3, 0.1, 7, 1e-6, "gaussian")
    assert Fraction(odd.spent) >= 3 * Fraction(0.1) ** 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"spent_units": -1}, "spent_units must be >= 0, got spent_units=-1"),
        ({"spent_units": 1.5}, "spent_units must be an integer, got spent_units=1.5"),
        ({"spent_units": True}, "spent_units must be an integer, got spent_units=True"),
        ({"variance_units": 0}, "variance_units must be > 0, got variance_units=0"),
        ({"granularity": 0.0}, "granularity must be finite and > 0, got granularity=0.0"),
        ({"delta": 1.5}, "delta must be in (0, 1), got delta=1.5"),
        ({"mechanism": "laplace"}, "got mechanism='laplace'"),
    ],
)
def test_user_loss_validation(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "spent_units": 10,
        "granularity": 2.0**-10,
        "variance_units": 100,
        "delta": 1e-6,
        "mechanism": "discrete_gaussian",
    }
    args.update(kwargs)
    with pytest.raises(ValueError) as info:
        user_loss(**args)  # type: ignore[arg-type]
    assert message in str(info.value)


# ------------------------------------------------------------------------------------------------
# discretised_odometer (Algorithm 5 / Corollary 4.11, integer units)
# ------------------------------------------------------------------------------------------------


def test_discretised_odometer_examples() -> None:
    assert discretised_odometer(0, 10) == 0
    assert discretised_odometer(1, 10) == 10
    assert discretised_odometer(10, 10) == 10
    assert discretised_odometer(11, 10) == 20
    assert discretised_odometer(2**62 + 1, 2**31) == (2**31 + 1) * 2**31  # exact on big ints


@settings(max_examples=200, deadline=None)
@given(
    spent=st.integers(min_value=0, max_value=2**63), step=st.integers(min_value=1, max_value=2**40)
)
def test_discretised_odometer_is_ceil_to_step(spent: int, step: int) -> None:
    value = discretised_odometer(spent, step)
    assert value % step == 0
    assert spent <= value < spent + step
    assert value == math.ceil(Fraction(spent, step)) * step


def algorithm_5_restarts(step: int, costs: list[int]) -> int:
    """Literal Algorithm 5 (restart a filter of budget Δ when the open one would halt): ``m·Δ``."""
    value, window = step, 0
    for cost in costs:
        if window + cost > step:
            value, window = value + step, cost
        else:
            window += cost
    return value


@settings(max_examples=100, deadline=None)
@given(costs=st.lists(st.integers(min_value=0, max_value=50), max_size=40))
def test_discretised_odometer_never_above_algorithm_5(costs: list[int]) -> None:
    """The nested-budget value is <= Algorithm 5's restart value on the same integer costs."""
    step = 50
    for k in range(len(costs) + 1):
        total = sum(costs[:k])
        assert total <= discretised_odometer(total, step) <= algorithm_5_restarts(step, costs[:k])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, 10), "spent_units must be >= 0, got spent_units=-1"),
        ((5, 0), "step_units must be >= 1, got step_units=0"),
        ((5.0, 10), "spent_units must be an integer, got spent_units=5.0"),
    ],
)
def test_discretised_odometer_validation(args: tuple[object, object], message: str) -> None:
    with pytest.raises(ValueError) as info:
        discretised_odometer(*args)  # type: ignore[arg-type]
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: linf_bound(4.0, 0.5, 0, 1e-6), "d must be an integer >= 1, got d=0"),
        (lambda: linf_bound(4.0, 0.0, 3, 1e-6), "rho must be finite and > 0, got rho=0.0"),
        (lambda: linf_bound(-4.0, 0.5, 3, 1e-6), "b_norm must be finite and > 0, got b_norm=-4.0"),
        (lambda: linf_bound(4.0, 0.5, 3, 1.0), "delta must be in (0, 1), got delta=1.0"),
        (
            lambda: linf_bound(4.0, 0.5, 3, 0.1, mechanism="laplace"),  # type: ignore[arg-type]
            "got mechanism='laplace'",
        ),
        (lambda: gaussian_halfwidth(-1.0), "sigma must be finite and >= 0, got sigma=-1.0"),
        (lambda: gaussian_halfwidth(1.0, 1.0), "coverage must be in (0, 1), got coverage=1.0"),
    ],
)
def test_accuracy_validation(call, message: str) -> None:
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)
