"""Per-user realized privacy loss under the individual filter (Feldman & Zrnic §4.4).

**These values are sensitive.** A user's spent budget depends on that user's own data, so it may
be shown to that user only (Feldman & Zrnic §4.4: the individual tracker "can be disclosed to the
respective user without violating the other users' privacy"; Yu et al. §3.4 on releasing
individual privacy parameters to their owners; docs/design.md §6 item 11). Statistics over users may
be released only through a separate, noisy and separately budgeted mechanism.

Units: ``spent_units`` is the user's exact integer ``Σ‖r‖²`` in lattice units (the same integer the
filter compares with its budget); ``granularity`` is γ; ``variance_units`` is the per-coordinate
variance of the noise actually drawn, in the same units (:func:`noise_variance_units`).

One formula: :func:`rho_of_units` is the only place a cost becomes a zCDP parameter. The CLI's
``budget``, the device odometer, the run's effective guarantee (``PrivacyParams.rho_effective``,
shown by ``guarantee``, the report and the metrics) all go through it.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction

from streamfilter.privacy.accounting import (
    Mechanism,
    epsilon_from_rho_cks,
    epsilon_from_rho_gdp,
    tightest_method,
)
from streamfilter.privacy.lattice import Lattice
from streamfilter.privacy.rounding import float_up

__all__ = [
    "UserLoss",
    "discretised_odometer",
    "noise_variance_units",
    "rho_of_units",
    "user_loss",
]


def noise_variance_units(mechanism: Mechanism, sigma: float, granularity: float) -> Fraction:
    """Per-coordinate variance of the noise actually drawn, in lattice units (exact).

    ``discrete_gaussian``: the sampler draws ``N_Z(0, s²)`` with the integer
    ``s² = ceil(σ²/γ²)`` (:meth:`Lattice.sigma2_units`), so ``s²`` is the variance, not ``σ²/γ²``.
    ``gaussian``: the continuous sampler draws ``N(0, σ²)`` with the calibrated σ (data units),
    i.e. exactly ``σ²/γ²`` lattice units; rounding it up would *under*-state the loss.
    """
    tightest_method(mechanism)  # validates mechanism
    lattice = Lattice(granularity)
    if mechanism == "discrete_gaussian":
        return Fraction(lattice.sigma2_units(sigma))
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be a positive finite number, got sigma={sigma!r}")
    return Fraction(sigma) ** 2 / lattice.gamma**2


def rho_of_units(units: int, variance_units: Fraction) -> Fraction:
    """zCDP of contributions of total squared norm ``units`` against Gaussian noise of variance
    ``variance_units`` per coordinate (both lattice units): exactly ``units / (2·variance)``.

    A shift ``r`` under ``N(0, s²)`` noise is ``‖r‖²/(2s²)``-zCDP (Bun & Steinke 2016, Prop. 1.6);
    for the discrete Gaussian and integer shifts the same holds (Canonne, Kamath & Steinke 2020,
    Prop. 5 / Thm. 15). Per-query parameters add up (Feldman & Zrnic, Example 2.7 and eq. (2)).
    """
    if variance_units <= 0:
        raise ValueError(f"variance_units must be > 0, got variance_units={variance_units!r}")
    return Fraction(units) / (2 * Fraction(variance_units))


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {name}={value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value!r}")
    return int(value)


@dataclass(frozen=True)
class UserLoss:
    """One user's realized loss. Sensitive: for that user's eyes only (see module docstring).

    ``spent``          ``Σ‖q‖²`` in data units (``spent_units·γ²``), rounded up.
    ``rho_spent``      realized individual zCDP ``spent_units / (2·sigma2_units)``, rounded up.
    ``epsilon_spent``  ε at ``delta`` from ``rho_spent`` by the tightest sound conversion for the
                       mechanism (``method``: ``gdp`` for the Gaussian, ``cks`` for the discrete
                       Gaussian).
    """

    spent: float
    rho_spent: float
    epsilon_spent: float
    delta: float
    spent_units: int
    method: str


def user_loss(
    spent_units: int,
    granularity: float,
    variance_units: int | Fraction,
    delta: float,
    mechanism: Mechanism,
) -> UserLoss:
    """The realized loss of one user who has spent ``spent_units`` (lattice units).

    ``ρ_i = Σ_t ‖r_t‖² / (2·s²)`` with ``s² = variance_units`` (:func:`rho_of_units`) is the sum
    of the user's individual zCDP parameters (Example 2.7 / equation (2) of Feldman & Zrnic, per
    query ``‖r_t‖²/(2s²)``); computed as an exact fraction, then rounded up to a float.

    What it certifies: the filter guarantee (Theorem 4.5) is for the budget fixed in advance. A
    realized value is backed by the odometer argument (Proposition 4.10 / Corollary 4.11): for
    any step Δ fixed in advance, the loss is at most :func:`discretised_odometer` ``(spent_units,
    Δ)`` (in the same units). ``rho_spent`` is the point value that bound rounds up; report the
    discretised value where a formal statement is needed.
    """
    spent = _check_int("spent_units", spent_units, 0)
    if isinstance(variance_units, bool) or not isinstance(variance_units, int | Fraction):
        raise ValueError(f"variance_units must be an int or Fraction, got {variance_units!r}")
    if variance_units <= 0:
        raise ValueError(f"variance_units must be > 0, got variance_units={variance_units!r}")
    if isinstance(granularity, bool) or not isinstance(granularity, numbers.Real):
        raise ValueError(f"granularity must be a real number, got granularity={granularity!r}")
    gamma = float(granularity)
    if not (math.isfinite(gamma) and gamma > 0.0):
        raise ValueError(f"granularity must be finite and > 0, got granularity={granularity!r}")
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real):
        raise ValueError(f"delta must be a real number, got delta={delta!r}")
    if not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must be in (0, 1), got delta={delta!r}")
    method = tightest_method(mechanism)  # validates mechanism

    spent_data = float_up(spent * Fraction(gamma) ** 2)
    rho_spent = float_up(rho_of_units(spent, Fraction(variance_units)))
    if method == "gdp":
        epsilon = epsilon_from_rho_gdp(rho_spent, float(delta))
    else:
        epsilon = epsilon_from_rho_cks(rho_spent, float(delta))
    return UserLoss(
        spent=spent_data,
        rho_spent=rho_spent,
        epsilon_spent=epsilon,
        delta=float(delta),
        spent_units=spent,
        method=method,
    )


def discretised_odometer(spent_units: int, step_units: int) -> int:
    """Upper bound on a user's loss in steps of Δ = ``step_units``: ``ceil(spent/Δ)·Δ``.

    Same integer units as the filter (lattice units of ``Σ‖r‖²``; divide by ``2·sigma2_units`` for
    zCDP). This is the discretised tracker of Algorithm 5 / Corollary 4.11, in its nested form:
    for a fixed m, run the same individual filter with budget ``m·Δ`` instead of B (Theorem 4.5:
    its output is (mΔ)-individually private). If ``m·Δ <= B``, that run makes the same decision
    as the real one at every step while the user's cumulative cost stays ``<= m·Δ`` (an admitted
    step fits both budgets; a refused one exceeds B, hence mΔ), so the real outputs so far are a
    prefix of its outputs — post-processing, as noted after Proposition 4.10 — with
    ``m = ceil(spent/Δ)``. If ``m·Δ > B`` the real filter's own bound B is already smaller.
    (Algorithm 5's restart rule charges at least this much, sometimes more.) A user who spent nothing contributed
    only zero vectors and gets 0. Like Corollary 4.11, the statement is for m fixed in advance;
    the value reported is the m reached.

    Sensitive, like :func:`user_loss`.
    """
    spent = _check_int("spent_units", spent_units, 0)
    step = _check_int("step_units", step_units, 1)
    return -(-spent // step) * step
