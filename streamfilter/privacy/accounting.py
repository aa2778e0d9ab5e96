"""Calibration and (ε, δ) reporting for a ρ-zCDP run.

Pure math (standard library and ``scipy`` only): no I/O, no state.

What is computed, and the proof each number rests on
----------------------------------------------------
* ``σ = sqrt(B_norm / (2ρ))`` — Corollary 4.7 of Feldman & Zrnic (the individual Rényi filter
  with Gaussian noise of that scale is ρ-zCDP for *any* number of adaptively chosen queries).
  The discrete Gaussian ``N_Z(0, (σ/γ)²)`` on the lattice has the same zCDP guarantee
  (Canonne, Kamath & Steinke 2020, "CKS" below).
* ρ-zCDP ⇒ (ε, δ)-DP, three ways, loosest first:

  ``thm49``  Theorem 4.9 of Feldman & Zrnic (from Bun & Steinke 2016, Prop. 1.3):
             ``ε = ρ + 2·sqrt(ρ·log(1/δ))``, equivalently
             ``ρ = (sqrt(log(1/δ) + ε) − sqrt(log(1/δ)))²``.  Valid for every ρ-zCDP mechanism.
  ``cks``    CKS 2020, Proposition 12 / Corollary 13 (also Asoodeh et al., arXiv:2001.05990):
             ``δ = inf_{α>1} exp((α−1)(αρ−ε)) · (1−1/α)^α / (α−1)``.  Valid for every ρ-zCDP
             mechanism, in particular the discrete Gaussian.
  ``gdp``    The exact trade-off curve of a μ-GDP mechanism, μ = sqrt(2ρ)
             (Dong, Roth & Su 2022, Cor. 2.13): ``δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2)``.
             Valid for the *continuous* Gaussian mechanism under fully adaptive composition with
             an individual filter (Smith & Thakurta 2022; Koskela, Tobaben & Honkela 2023).
             The discrete Gaussian is not exactly μ-GDP, so this is never used for it.

Soundness of the floating-point numbers
---------------------------------------
Every reported value is rounded in the direction that weakens the claim: δ and ε up, ρ down.

* For ``cks`` the infimum over α is a family of valid bounds, one per order: whatever order the
  optimiser lands on, the bound *at that order* is a true statement. The optimiser therefore only
  affects tightness; soundness only needs the one-order bound to be evaluated correctly, and we
  add an explicit bound on its floating-point evaluation error (``_EVAL_ERR`` below).
* For ``gdp`` the curve is evaluated in log space with the same kind of error allowance.
* Inverse problems (ε from ρ and δ, ρ from ε and δ) are solved with ``brentq`` and the root is
  then moved outward by a relative ``_SOLVER_MARGIN = 1e-12`` (far above brentq's tolerance of a
  few ulps) and *re-checked* against the forward bound; if the check fails the margin grows.
  These are guards against optimistic rounding, not interval arithmetic.
* Where two conversions are both valid (thm49 and cks for any zCDP mechanism; cks and gdp for
  the continuous Gaussian) the reported value is the better of the two, so the order
  ``gdp <= cks <= thm49`` (ε) holds even where float slack or the range limits below would
  otherwise break it. The better of two valid bounds is valid.

Range: ρ below ``1e-200`` is evaluated at ``1e-200`` by the CKS code (both CKS quantities are
non-decreasing in ρ, so this only loosens); above ``RHO_MAX = 1e100`` the CKS and GDP conversions
report no privacy (ε = inf, δ = 1) rather than overflow.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Literal, get_args

from streamfilter.privacy.rounding import float_up

__all__ = [
    "CONVERSIONS",
    "MECHANISMS",
    "RHO_MAX",
    "Conversion",
    "Guarantee",
    "Mechanism",
    "calibrate_rho",
    "delta_from_mu_epsilon_gdp",
    "delta_from_rho_epsilon_cks",
    "epsilon_from_rho_cks",
    "epsilon_from_rho_gdp",
    "epsilon_from_rho_thm49",
    "guarantee",
    "mu_for_rho",
    "rho_for_sigma",
    "rho_from_epsilon_delta_cks",
    "rho_from_epsilon_delta_gdp",
    "rho_from_epsilon_delta_thm49",
    "rho_stated",
    "sigma_for_rho",
    "tightest_method",
]

Mechanism = Literal["discrete_gaussian", "gaussian"]
MECHANISMS: tuple[str, ...] = get_args(Mechanism)

Conversion = Literal["thm49", "cks", "gdp"]
CONVERSIONS: tuple[str, ...] = get_args(Conversion)

#: Unit roundoff of IEEE double precision.
_U = 2.0**-53
#: Allowance for the evaluation error of an expression, per unit of the sum of the absolute values
#: of its terms. The CKS expressions are three or four terms of at most four correctly rounded
#: operations and one ``log1p`` (< 1 ulp) each, summed: <= ~8 roundings, so 16·u per unit
#: magnitude. ``scipy.special.log_ndtr`` is not correctly rounded, so GDP gets 64·u.
_EVAL_ERR = 16 * _U
_GDP_EVAL_ERR = 64 * _U
#: Relative outward move applied to every root found by brentq before it is re-checked.
_SOLVER_MARGIN = 1e-12
#: Relative outward move applied to closed-form results (a few correctly rounded operations).
_CLOSED_FORM_MARGIN = 16 * _U
#: ρ below this is evaluated at this value in the CKS bounds. δ_cks and ε_cks are non-decreasing
#: in ρ, so this is conservative; it keeps every order α − 1 <= ~1e102 representable.
_CKS_RHO_FLOOR = 1e-200
#: Above this ρ the CKS and GDP conversions report no privacy (ε = inf, δ = 1) instead of
#: evaluating expressions that overflow. Far outside any meaningful configuration.
RHO_MAX = 1e100
#: Largest log(α − 1) evaluated (exp stays finite).
_U_MAX = 700.0
#: Relative slack accepted in :func:`guarantee` between the configured ρ and the ρ implied by σ.
_SIGMA_CONSISTENCY_SLACK = 1e-9

_BRENTQ_XTOL = 1e-300
_BRENTQ_RTOL = 4 * 2.0**-52
_BRENTQ_MAXITER = 1000
_MAX_BRACKET_STEPS = 2100


# --------------------------------------------------------------------------------------------
# argument checking
# --------------------------------------------------------------------------------------------


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {name}={value!r}")
    number = float(value)
    if math.isnan(number):
        raise ValueError(f"{name} must not be NaN, got {name}={value!r}")
    return number


def _check_delta(delta: object, name: str = "delta") -> float:
    value = _real(name, delta)
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {name}={delta!r}")
    return value


def _check_nonnegative(name: str, value: object) -> float:
    number = _real(name, value)
    if not (math.isfinite(number) and number >= 0.0):
        raise ValueError(f"{name} must be finite and >= 0, got {name}={value!r}")
    return number


def _check_positive(name: str, value: object) -> float:
    number = _real(name, value)
    if not (math.isfinite(number) and number > 0.0):
        raise ValueError(f"{name} must be finite and > 0, got {name}={value!r}")
    return number


def _check_mechanism(mechanism: object) -> Mechanism:
    if mechanism not in MECHANISMS:
        raise ValueError(
            f"mechanism must be one of {', '.join(MECHANISMS)}, got mechanism={mechanism!r}"
        )
    return mechanism  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# rounding helpers
# --------------------------------------------------------------------------------------------


def _exp_up(x: float) -> float:
    """``exp(x)`` rounded up (libm's exp is within one ulp)."""
    return math.nextafter(math.exp(x), math.inf)


def _up(x: float, rel: float) -> float:
    """``x`` moved up by at least ``rel·|x|`` and at least one ulp."""
    return math.nextafter(x + abs(x) * rel, math.inf)


def _down(x: float, rel: float) -> float:
    """``x`` moved down by at least ``rel·|x|`` and at least one ulp, never below 0."""
    return max(0.0, math.nextafter(x - abs(x) * rel, -math.inf))


def _certify(holds: Callable[[float], bool], start: float, direction: float) -> float:
    """Move ``start`` outward (``direction`` = +1 up, −1 down) until ``holds`` is true."""
    value = start
    rel = _SOLVER_MARGIN
    for _ in range(200):
        if holds(value):
            return value
        rel *= 2.0
        value = _up(start, rel) if direction > 0 else _down(start, rel)
    raise ArithmeticError(f"could not certify a conservative value near {start!r}")


def _brentq(fn: Callable[[float], float], lo: float, hi: float) -> float:
    import scipy.optimize  # lazy: a start-up that needs no root finding does not pay for it

    root: float = scipy.optimize.brentq(
        fn, lo, hi, xtol=_BRENTQ_XTOL, rtol=_BRENTQ_RTOL, maxiter=_BRENTQ_MAXITER
    )
    return root


def _bracket_log(
    fn: Callable[[float], float], start: float, *, increasing: bool
) -> tuple[float, float]:
    """Find ``lo < hi`` in log space with ``fn(lo) <= 0 <= fn(hi)`` (``increasing``) by doubling."""
    lo = hi = math.log(start)
    sign = 1.0 if increasing else -1.0
    steps = 0
    while sign * fn(lo) > 0.0:
        lo -= math.log(2.0)
        steps += 1
        if steps > _MAX_BRACKET_STEPS:
            raise ArithmeticError("could not bracket the root from below")
    while sign * fn(hi) < 0.0:
        hi += math.log(2.0)
        steps += 1
        if steps > _MAX_BRACKET_STEPS:
            raise ArithmeticError("could not bracket the root from above")
    return lo, hi


# --------------------------------------------------------------------------------------------
# calibration: Corollary 4.7
# --------------------------------------------------------------------------------------------


def sigma_for_rho(b_norm: float, rho: float) -> float:
    """Noise scale ``σ = sqrt(B_norm / (2ρ))`` giving ρ-zCDP (Feldman & Zrnic, Corollary 4.7).

    ``b_norm`` is the per-user budget on ``Σ‖q‖²`` (data units²). The returned float is the
    smallest double with ``B_norm / (2σ²) <= ρ`` in exact rational arithmetic, so the pair
    ``(b_norm, σ)`` never claims more than ρ.
    """
    b = _check_positive("b_norm", b_norm)
    r = _check_positive("rho", rho)
    sigma = math.sqrt(b / (2.0 * r))
    if not math.isfinite(sigma) or sigma == 0.0:
        raise ValueError(f"sigma for b_norm={b_norm!r}, rho={rho!r} is not a finite positive float")
    exact_b, exact_r = Fraction(b), Fraction(r)
    while exact_b / (2 * Fraction(sigma) ** 2) > exact_r:
        sigma = math.nextafter(sigma, math.inf)
    return sigma


def rho_for_sigma(b_norm: float, sigma: float) -> float:
    """zCDP ``ρ = B_norm / (2σ²)`` of the Gaussian filter with noise σ (Corollary 4.7), rounded up.

    Edge cases: ``σ = inf`` gives 0; ``σ = 0`` gives ``inf`` (no privacy).
    """
    b = _check_positive("b_norm", b_norm)
    s = _real("sigma", sigma)
    if s < 0.0:
        raise ValueError(f"sigma must be >= 0, got sigma={sigma!r}")
    if s == math.inf:
        return 0.0
    if s == 0.0:
        return math.inf
    exact = Fraction(b) / (2 * Fraction(s) ** 2)
    if exact > Fraction(1.7976931348623157e308):
        return math.inf
    return float_up(exact)


def mu_for_rho(rho: float) -> float:
    """GDP parameter ``μ = sqrt(2ρ)`` of a Gaussian mechanism that is ρ-zCDP, rounded up."""
    r = _check_nonnegative("rho", rho)
    if r == 0.0:
        return 0.0
    return math.nextafter(math.sqrt(2.0 * r), math.inf)


# --------------------------------------------------------------------------------------------
# Theorem 4.9 ("simple") conversion
# --------------------------------------------------------------------------------------------


def epsilon_from_rho_thm49(rho: float, delta: float) -> float:
    """``ε = ρ + 2·sqrt(ρ·log(1/δ))`` (Feldman & Zrnic, proof of Theorem 4.9; Fact 2.4).

    Rounded up. ``ρ = 0`` gives ``ε = 0``.
    """
    r = _check_nonnegative("rho", rho)
    d = _check_delta(delta)
    if r == 0.0:
        return 0.0
    log_inv_delta = -math.log(d)
    return _up(r + 2.0 * math.sqrt(r * log_inv_delta), _CLOSED_FORM_MARGIN)


def rho_from_epsilon_delta_thm49(epsilon: float, delta: float) -> float:
    """``B* = (sqrt(log(1/δ) + ε) − sqrt(log(1/δ)))²`` (Feldman & Zrnic, Theorem 4.9).

    Evaluated as ``ε² / (sqrt(log(1/δ) + ε) + sqrt(log(1/δ)))²`` to avoid the cancellation of the
    difference of square roots, then rounded down. ``ε = 0`` gives ``ρ = 0``.
    """
    e = _check_nonnegative("epsilon", epsilon)
    d = _check_delta(delta)
    if e == 0.0:
        return 0.0
    log_inv_delta = -math.log(d)
    denominator = math.sqrt(log_inv_delta + e) + math.sqrt(log_inv_delta)
    return _down((e / denominator) ** 2, _CLOSED_FORM_MARGIN)


# --------------------------------------------------------------------------------------------
# CKS conversion (Canonne, Kamath & Steinke 2020, Prop. 12 / Cor. 13)
# --------------------------------------------------------------------------------------------
#
# Write x = α − 1 > 0. The bound at one order, in log space, is
#
#     f(x) = log δ_α = x·((x+1)ρ − ε) + x·log(x/(x+1)) − log(1+x)                      (C1)
#
# (the same as (α−1)(αρ−ε) + α·log(1−1/α) − log(α−1)). Its derivative in x is
#
#     f'(x) = (2x+1)ρ − ε + log(x/(x+1)),     f''(x) = 2ρ + 1/x − 1/(x+1) > 0,            (C2)
#
# so f is strictly convex and its minimiser is the unique root of (C2): we find it with brentq in
# u = log x (x ranges over hundreds of orders of magnitude for tiny or huge ρ).
#
# Solving (C1) = log δ for ε at the optimal order gives, for that order,
#
#     ε_α = αρ + (log(1/δ) + α·log(1−1/α) − log(α−1)) / (α−1)                              (C3)
#
# (the dp_accounting RDP→DP formula), and eliminating ε between (C1) at its minimiser and (C2)
# shows that the order optimal for a *given δ* solves
#
#     ρx² + log(1+x) = log(1/δ).                                                            (C4)


def _log_ratio(x: float, u: float) -> float:
    """``log(x/(x+1))`` without cancellation (``u = log x``; for x >= 1, log x − log(1+x) would
    cancel, so use −log1p(1/x))."""
    if x >= 1.0:
        return -math.log1p(1.0 / x)
    return u - math.log1p(x)


def _x_log_ratio(x: float, u: float) -> float:
    """``x·log(x/(x+1))`` (0 when x underflows)."""
    return x * _log_ratio(x, u) if x > 0.0 else 0.0


def _cks_log_delta_at(u: float, rho: float, epsilon: float) -> float:
    """Upper bound on the float evaluation of (C1) at ``x = e^u``."""
    x = math.exp(u)
    t1 = x * ((x + 1.0) * rho - epsilon)
    t2 = _x_log_ratio(x, u)
    t3 = -math.log1p(x)
    value = t1 + t2 + t3
    if value == -math.inf:  # t1 overflowed downward: δ underflows at this order
        return -math.inf
    err = _EVAL_ERR * (abs(x * ((x + 1.0) * rho)) + abs(x * epsilon) + abs(t2) + abs(t3))
    bound = value + err
    return bound if not math.isnan(bound) else 0.0


def _cks_epsilon_at(u: float, rho: float, log_inv_delta: float) -> float:
    """Upper bound on the float evaluation of (C3) at ``x = e^u``."""
    x = math.exp(u)
    t1 = (x + 1.0) * rho
    t2 = log_inv_delta / x
    t3 = _x_log_ratio(x, u) / x
    t4 = -math.log1p(x) / x
    value = t1 + t2 + t3 + t4
    err = _EVAL_ERR * (abs(t1) + abs(t2) + abs(t3) + abs(t4))
    return value + err


def _cks_optimal_u_for_epsilon(rho: float, epsilon: float) -> float:
    """Root of (C2) in ``u = log x`` (ρ > 0)."""

    def derivative(u: float) -> float:
        x = math.exp(u)
        return (2.0 * x + 1.0) * rho + _log_ratio(x, u) - epsilon

    # For u <= 0: derivative <= 3ρ + u − ε, so u_lo = min(0, ε − 3ρ − 1) gives <= −1.
    # For x >= max(1, (ε+1)/(2ρ)): derivative >= ε + 1 + ρ − log 2 − ε > 0.
    u_lo = min(0.0, epsilon - 3.0 * rho - 1.0)
    u_hi = min(max(0.0, math.log1p(epsilon) - math.log(2.0 * rho)), _U_MAX)
    if derivative(u_hi) <= 0.0:
        # The optimum lies beyond the largest order we evaluate; (C1) at any order is a valid
        # bound, so use the largest one (δ there is astronomically small anyway).
        return u_hi
    return _brentq(derivative, u_lo, u_hi)


def _cks_log_delta_upper(rho: float, epsilon: float) -> float:
    """log of an upper bound on the CKS δ for ρ > 0."""
    if rho > RHO_MAX:
        return 0.0
    rho = max(rho, _CKS_RHO_FLOOR)
    u = _cks_optimal_u_for_epsilon(rho, epsilon)
    return min(0.0, _cks_log_delta_at(u, rho, epsilon))


def delta_from_rho_epsilon_cks(rho: float, epsilon: float) -> float:
    """Smallest δ such that ρ-zCDP implies (ε, δ)-DP by CKS 2020, Corollary 13.

    ``δ = inf_{α>1} exp((α−1)(αρ−ε)) · (1−1/α)^α / (α−1)``, minimised exactly (the log of the
    objective is strictly convex in α; see (C1)–(C2) in the source) and rounded up.

    Edge cases: ``ρ = 0`` gives δ = 0 (identical output distributions). ``ε = inf`` gives 0.
    A positive δ that underflows is returned as the smallest positive double (rounded up).
    """
    r = _check_nonnegative("rho", rho)
    e = _real("epsilon", epsilon)
    if e < 0.0:
        raise ValueError(f"epsilon must be >= 0, got epsilon={epsilon!r}")
    if r == 0.0 or e == math.inf:
        return 0.0
    if r > RHO_MAX:
        return 1.0
    log_delta = _cks_log_delta_upper(r, e)
    return min(1.0, max(_exp_up(log_delta), math.nextafter(0.0, 1.0)))


def epsilon_from_rho_cks(rho: float, delta: float) -> float:
    """Smallest ε such that ρ-zCDP implies (ε, δ)-DP by CKS 2020, Corollary 13, rounded up.

    The optimal order solves (C4) ``ρ(α−1)² + log α = log(1/δ)`` (found with brentq); ε is then
    the per-order bound (C3) at that order, which is a valid ε whichever order is used, plus an
    allowance for its floating-point evaluation error (so no solver margin is needed here).
    A negative value means (0, δ)-DP holds and is reported as 0. ``ρ = 0`` gives 0.
    """
    r = _check_nonnegative("rho", rho)
    d = _check_delta(delta)
    if r == 0.0:
        return 0.0
    if r > RHO_MAX:
        return math.inf
    r = max(r, _CKS_RHO_FLOOR)  # conservative: ε_cks is non-decreasing in ρ
    log_inv_delta = -math.log(d)
    log_r = math.log(r)

    def envelope(u: float) -> float:
        return math.exp(2.0 * u + log_r) + math.log1p(math.exp(u)) - log_inv_delta

    # x = min(sqrt(2L/ρ), 2e^L) makes (C4) clearly positive (>= L or >= L + log 2, before the
    # other non-negative term); x = min(sqrt(L/(4ρ)), L/4) makes it <= −L/2.
    log_l = math.log(log_inv_delta)
    log_2 = math.log(2.0)
    u_hi = min(0.5 * (log_2 + log_l - log_r), log_inv_delta + log_2)
    u_lo = min(0.5 * (log_l - log_r - 2.0 * log_2), log_l - 2.0 * log_2)
    u = _brentq(envelope, u_lo, u_hi)
    epsilon = _cks_epsilon_at(u, r, log_inv_delta)
    if not math.isfinite(epsilon):
        return math.inf
    # (C3) is a valid ε at *any* order, so no solver margin is needed: only the evaluation
    # allowance already added in _cks_epsilon_at, plus one ulp. Theorem 4.9's ε is also valid for
    # every ρ-zCDP mechanism; taking the smaller keeps the order thm49 >= cks under float slack.
    epsilon = math.nextafter(epsilon, math.inf) if epsilon > 0.0 else 0.0
    return min(epsilon, epsilon_from_rho_thm49(rho, delta))


def rho_from_epsilon_delta_cks(epsilon: float, delta: float) -> float:
    """Largest ρ such that ρ-zCDP implies (ε, δ)-DP by CKS 2020, Corollary 13, rounded down.

    Solves ``δ_cks(ρ, ε) = δ`` (increasing in ρ) with brentq in ``log ρ``, moves the root down by a
    relative 1e-12 and checks ``δ_cks(ρ, ε) <= δ`` again before returning. ``ε = 0`` is allowed and
    gives a positive ρ ((0, δ)-DP is possible for small ρ).
    """
    e = _check_nonnegative("epsilon", epsilon)
    d = _check_delta(delta)
    log_target = math.log(d)

    def excess(v: float) -> float:
        return _cks_log_delta_upper(math.exp(v), e) - log_target

    if excess(math.log(_CKS_RHO_FLOOR)) > 0.0:
        return 0.0  # the answer is below the smallest ρ we evaluate: certify nothing
    # Thm 4.9 is looser, so its ρ is a lower bracket (for ε = 0 it is 0: start near δ²).
    start = max(rho_from_epsilon_delta_thm49(e, d), d * d, _CKS_RHO_FLOOR)
    lo, hi = _bracket_log(excess, start, increasing=True)
    root = math.exp(_brentq(excess, lo, hi))

    def holds(r: float) -> bool:
        return r == 0.0 or _cks_log_delta_upper(r, e) <= log_target

    # Theorem 4.9's ρ is also certified; the larger of two certified values is certified.
    return max(_certify(holds, _down(root, _SOLVER_MARGIN), -1), rho_from_epsilon_delta_thm49(e, d))


# --------------------------------------------------------------------------------------------
# Gaussian DP (continuous Gaussian only)
# --------------------------------------------------------------------------------------------


def _gdp_log_delta_upper(mu: float, epsilon: float) -> float:
    """log of an upper bound on ``Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)`` (μ > 0, finite ε >= 0).

    With ``a = log Φ(−ε/μ + μ/2)`` and ``b = ε + log Φ(−ε/μ − μ/2)`` (``b < a``):
    ``log δ = a + log(−expm1(b − a))``; ``log_ndtr`` keeps both terms accurate deep in the tail.
    """
    if mu == 0.0:  # reachable from bracketing; δ(0, ε) = 0
        return -math.inf
    import scipy.special  # lazy (start-up time)

    a = float(scipy.special.log_ndtr(mu / 2.0 - epsilon / mu))
    if a == -math.inf:  # δ <= Φ(−ε/μ + μ/2) underflows: report the smallest positive double
        return -math.inf
    b = epsilon + float(scipy.special.log_ndtr(-mu / 2.0 - epsilon / mu))
    err = _GDP_EVAL_ERR * (abs(a) + abs(b) + abs(epsilon / mu) + mu + 1.0)
    gap = min(b - a, 0.0) - err  # more negative ⇒ larger δ
    return min(0.0, a + err + math.log(-math.expm1(gap)))


def delta_from_mu_epsilon_gdp(mu: float, epsilon: float) -> float:
    """δ(ε) of a μ-GDP mechanism (Dong, Roth & Su 2022, Corollary 2.13), rounded up.

    ``δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2)``, computed in log space with
    ``scipy.special.log_ndtr``. Edge cases: ``μ = 0`` or ``ε = inf`` give 0.
    Only for the continuous Gaussian mechanism (see the module docstring).
    """
    m = _check_nonnegative("mu", mu)
    e = _real("epsilon", epsilon)
    if e < 0.0:
        raise ValueError(f"epsilon must be >= 0, got epsilon={epsilon!r}")
    if m == 0.0 or e == math.inf:
        return 0.0
    return min(1.0, max(_exp_up(_gdp_log_delta_upper(m, e)), math.nextafter(0.0, 1.0)))


def epsilon_from_rho_gdp(rho: float, delta: float) -> float:
    """Smallest ε with ``δ_GDP(μ = sqrt(2ρ), ε) <= δ``, rounded up. Continuous Gaussian only.

    Valid for the individual filter under full adaptivity by the GDP filter (Smith & Thakurta
    2022; Koskela, Tobaben & Honkela 2023). ``ρ = 0`` gives 0; if ``δ_GDP(μ, 0) <= δ`` the answer
    is 0. Otherwise brentq on ``log δ_GDP(μ, ε) − log δ`` (decreasing in ε) bracketed by
    ``[0, ε_cks]``, then the root is moved up and re-checked.
    """
    r = _check_nonnegative("rho", rho)
    d = _check_delta(delta)
    if r == 0.0:
        return 0.0
    if r > RHO_MAX:
        return math.inf
    mu = mu_for_rho(r)
    log_target = math.log(d)

    def excess(e: float) -> float:
        return _gdp_log_delta_upper(mu, e) - log_target

    if excess(0.0) <= 0.0:
        return 0.0
    # ε spans many orders of magnitude (tiny μ ⇒ tiny ε): solve in log ε, starting from ε_cks,
    # which is an upper bound for the Gaussian.
    epsilon_cks = epsilon_from_rho_cks(r, d)
    lo, hi = _bracket_log(lambda v: excess(math.exp(v)), epsilon_cks or mu, increasing=False)
    root = math.exp(_brentq(lambda v: excess(math.exp(v)), lo, hi))
    # CKS is valid for the Gaussian too: never report more than it (float slack only).
    return min(_certify(lambda e: excess(e) <= 0.0, _up(root, _SOLVER_MARGIN), +1), epsilon_cks)


def rho_from_epsilon_delta_gdp(epsilon: float, delta: float) -> float:
    """Largest ρ with ``δ_GDP(sqrt(2ρ), ε) <= δ``, rounded down. Continuous Gaussian only.

    Solves for μ with brentq in ``log μ`` (δ_GDP increases with μ), sets ``ρ = μ²/2``, moves it
    down and re-checks with exactly the μ that :func:`epsilon_from_rho_gdp` would use.
    """
    e = _check_nonnegative("epsilon", epsilon)
    d = _check_delta(delta)
    log_target = math.log(d)

    def excess(v: float) -> float:
        return _gdp_log_delta_upper(math.exp(v), e) - log_target

    # CKS is looser for the Gaussian, so its μ is a lower bracket.
    rho_cks = rho_from_epsilon_delta_cks(e, d)
    lo, hi = _bracket_log(excess, math.sqrt(2.0 * rho_cks) or d, increasing=True)
    mu = math.exp(_brentq(excess, lo, hi))

    def holds(r: float) -> bool:
        return r == 0.0 or _gdp_log_delta_upper(mu_for_rho(r), e) <= log_target

    rho = _certify(holds, _down(min(mu * mu / 2.0, RHO_MAX), _SOLVER_MARGIN), -1)
    return max(rho, rho_cks)  # CKS's ρ is certified for the Gaussian as well


# --------------------------------------------------------------------------------------------
# the tightest *sound* conversion per mechanism
# --------------------------------------------------------------------------------------------


def tightest_method(mechanism: Mechanism) -> Conversion:
    """``gdp`` for the continuous Gaussian, ``cks`` for the discrete Gaussian.

    The discrete Gaussian is ρ-zCDP (CKS 2020) but not exactly μ-GDP — its δ(ε) exceeds the
    continuous curve slightly — so the GDP curve must not be claimed for it.
    """
    return "gdp" if _check_mechanism(mechanism) == "gaussian" else "cks"


def calibrate_rho(epsilon: float, delta: float, mechanism: Mechanism) -> tuple[float, str]:
    """Largest ρ whose run satisfies (ε, δ)-DP by the tightest sound conversion for ``mechanism``.

    Returns ``(rho, method)`` with ``method`` in ``{"gdp", "cks"}``. ρ is rounded down.
    """
    method = tightest_method(mechanism)
    e = _check_nonnegative("epsilon", epsilon)
    d = _check_delta(delta)
    rho = rho_from_epsilon_delta_gdp(e, d) if method == "gdp" else rho_from_epsilon_delta_cks(e, d)
    if rho == 0.0:
        raise ValueError(
            f"no positive rho satisfies epsilon={epsilon!r}, delta={delta!r} for {mechanism}"
        )
    return rho, method


def _epsilons(rho: float, delta: float, mechanism: Mechanism) -> dict[str, float]:
    result = {
        "thm49": epsilon_from_rho_thm49(rho, delta),
        "cks": epsilon_from_rho_cks(rho, delta),
    }
    if mechanism == "gaussian":
        result["gdp"] = epsilon_from_rho_gdp(rho, delta)
    return result


@dataclass(frozen=True)
class Guarantee:
    """The privacy guarantee of a run: ρ-zCDP always, and (ε, δ)-DP by each sound conversion.

    ``epsilon``/``method`` are the tightest conversion proven for ``mechanism``
    (:func:`tightest_method`); ``epsilon_by_method`` lists every conversion that applies
    (``thm49`` and ``cks`` always, ``gdp`` only for the continuous Gaussian), as a read-only map.
    """

    rho: float
    sigma: float
    b_norm: float
    mechanism: Mechanism
    delta: float
    epsilon: float
    method: str
    epsilon_by_method: Mapping[str, float]

    def to_json_dict(self) -> dict[str, Any]:
        """Plain-JSON form (keys: rho, sigma, b_norm, mechanism, delta, epsilon, method,
        epsilon_by_method)."""
        return {
            "rho": self.rho,
            "sigma": self.sigma,
            "b_norm": self.b_norm,
            "mechanism": self.mechanism,
            "delta": self.delta,
            "epsilon": self.epsilon,
            "method": self.method,
            "epsilon_by_method": dict(self.epsilon_by_method),
        }


def rho_stated(b_norm: float, rho: float, sigma: float) -> float:
    """The ρ to state for a run with budget ``b_norm``, claimed ρ and noise σ: the claim, or the
    ρ that σ implies, ``B_norm/(2σ²)`` (Corollary 4.7), when that is larger by at most a relative
    1e-9 (float slack from a lattice round trip) — never the smaller one. A σ that implies more
    is a ``ValueError``; a σ larger than needed is fine (the claim is then conservative)."""
    b = _check_positive("b_norm", b_norm)
    r = _check_positive("rho", rho)
    s = _check_positive("sigma", sigma)
    implied = rho_for_sigma(b, s)
    if implied > r:
        if implied > r * (1.0 + _SIGMA_CONSISTENCY_SLACK):
            raise ValueError(
                f"sigma={sigma!r} is too small for rho={rho!r} with b_norm={b_norm!r}: it gives "
                f"rho={implied!r}; use sigma_for_rho(b_norm, rho)"
            )
        return implied
    return r


def guarantee(
    b_norm: float, rho: float, sigma: float, mechanism: Mechanism, delta: float
) -> Guarantee:
    """Build the :class:`Guarantee` for a run with budget ``b_norm``, claimed ρ and noise σ.

    σ must support the claim: the ρ it implies, ``B_norm/(2σ²)`` (Corollary 4.7), may not exceed
    the claimed ρ by more than a relative 1e-9 (float slack from a lattice round trip); otherwise
    ``ValueError``. If it exceeds it by less, the implied (larger) ρ is reported — never the
    smaller one. A σ larger than needed is fine (the claim is then conservative).
    """
    r = rho_stated(b_norm, rho, sigma)  # checks b_norm, rho and sigma
    b, s = float(b_norm), float(sigma)
    m = _check_mechanism(mechanism)
    d = _check_delta(delta)
    by_method = _epsilons(r, d, m)
    method = tightest_method(m)
    return Guarantee(
        rho=r,
        sigma=s,
        b_norm=b,
        mechanism=m,
        delta=d,
        epsilon=by_method[method],
        method=method,
        epsilon_by_method=MappingProxyType(by_method),
    )
