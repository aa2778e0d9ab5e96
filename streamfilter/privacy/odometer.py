"""Per-user realized privacy loss under the individual filter (Feldman & Zrnic §4.4).

**These values are sensitive.** A user's spent budget depends on that user's own data, so it may
be shown to that user only (Feldman & Zrnic §4.4: the individual tracker "can be disclosed to the
respective user without violating the other users' privacy"; Yu et al. §3.4 on releasing
individual privacy parameters to their owners; DESIGN.md §6 item 11). Statistics over users may
be released only through a separate, noisy and separately budgeted mechanism.

Units: ``spent_units`` is the user's exact integer ``Σ‖r‖²`` in lattice units (the same integer the
filter compares with its budget); ``granularity`` is γ; ``sigma2_units`` is the integer noise
variance in lattice units, ``(σ/γ)²`` rounded up.
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
from streamfilter.privacy.rounding import float_up

__all__ = ["UserLoss", "discretised_odometer", "user_loss"]


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
    sigma2_units: int,
    delta: float,
    mechanism: Mechanism,
) -> UserLoss:
    """The realized loss of one user who has spent ``spent_units`` (lattice units).

    ``ρ_i = Σ_t ‖r_t‖² / (2·s²)`` with ``s² = sigma2_units`` is the sum of the user's individual
    zCDP parameters (Example 2.7 / equation (2) of Feldman & Zrnic, per query
    ``‖r_t‖²/(2s²)``); computed as an exact fraction, then rounded up to a float.

    What it certifies: the filter guarantee (Theorem 4.5) is for the budget fixed in advance. A
    realized value is backed by the odometer argument (Proposition 4.10 / Corollary 4.11): for
    any step Δ fixed in advance, the loss is at most :func:`discretised_odometer` ``(spent_units,
    Δ)`` (in the same units). ``rho_spent`` is the point value that bound rounds up; report the
    discretised value where a formal statement is needed.
    """
    spent = _check_int("spent_units", spent_units, 0)
    s2 = _check_int("sigma2_units", sigma2_units, 1)
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
    rho_spent = float_up(Fraction(spent, 2 * s2))
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
    (Algorithm 5's restart rule charges at least this much, sometimes more; see
    :class:`streamfilter.privacy.filters.PrivacyOdometer`.) A user who spent nothing contributed
    only zero vectors and gets 0. Like Corollary 4.11, the statement is for m fixed in advance;
    the value reported is the m reached.

    Sensitive, like :func:`user_loss`.
    """
    spent = _check_int("spent_units", spent_units, 0)
    step = _check_int("step_units", step_units, 1)
    return -(-spent // step) * step
