"""Calibration of private GD (Algorithms 6 and 7) to a target (ε, δ), checks included.

The conversion (which, and why it is sound here)
-----------------------------------------------
Every release is a Gaussian mechanism: the noisy gradient sums (continuous Gaussian, per-example
sensitivity ≤ C, and under Algorithm 7 adaptively chosen individual sensitivities kept under
B_norm by the filter) and the noisy accuracy counts (sensitivity 1). Such a fully adaptive
composition with an individual filter is μ-GDP with ``μ² = 2ρ`` (Smith & Thakurta 2022;
Koskela, Tobaben & Honkela 2023), so the target is met through the exact GDP trade-off curve
(Dong, Roth & Su 2022, Cor. 2.13): ``streamfilter.privacy.accounting.calibrate_rho(ε, δ,
"gaussian")``, the tightest sound conversion the privacy core offers for the continuous
Gaussian (CKS 2020 Cor. 13 would also be sound, and looser).

The budget split
----------------
With ``ρ = calibrate_rho(ε, δ)``:

* Algorithm 6 runs ``k = ⌊2σ²ρ⌋`` steps: ``k/(2σ²) <= ρ`` (Proposition 5.1).
* Algorithm 7 gives ``check_fraction·ρ`` to its ``checks`` accuracy checks, each with noise
  ``s = sqrt(checks/(2·check_fraction·ρ))`` (their zCDP adds up to ``checks/(2s²)``), and the
  rest to the filter: ``B_norm = 2σ²C²·(ρ − checks/(2s²))`` (Proposition 5.2). The total
  ``B_norm/(2σ²C²) + checks/(2s²) <= ρ`` is re-checked in exact arithmetic before returning.

Every ρ here is ``rho_for_sigma`` of the privacy core (``B/(2σ²)``, Corollary 4.7): one function
for Propositions 5.1, 5.2 and the checks.

``checks = 0`` (an ablation, not the paper's rule): no checks, the whole ρ goes to the filter
(``B_norm = 2σ²C²ρ``, the paper's ``k·C²`` up to rounding) and Algorithm 7 returns its last
iterate after ``extra_steps`` steps beyond ``⌊B_norm/C²⌋``.

Two protocols
-------------
``"private-checks"`` (above): the checks are paid from the target, so both arms are (ε, δ)-DP.

``"paper"``: Feldman & Zrnic's Appendix A as run there: ``B_norm = k·C²`` with Algorithm 6's k
(so the filter alone has exactly Algorithm 6's ρ), the ``checks`` accuracy checks counted
*exactly* (``check_sigma = 0``) from step k every ``check_every`` steps, ``k_max = k +
check_every·(checks − 1)``; with ``checks = 0`` (the paper's ε = 1 tuned cell) ``k_max = k`` and
Algorithm 7 is Algorithm 6. The exact checks are **not private**: ``checks_private`` is False
and ``epsilon_filtered`` is the filter's ε alone, a statement about the iterates, not about the
chosen one (the paper argues the checks would cost < 1 % of ε; it does not pay for them).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from streamfilter.privacy.accounting import (
    calibrate_rho,
    epsilon_from_rho_gdp,
    rho_for_sigma,
    sigma_for_rho,
)

from .grid import PROTOCOLS

__all__ = ["GDPlan", "plan_gd"]


@dataclass(frozen=True)
class GDPlan:
    """Hyperparameters and guarantees of one (Algorithm 6, Algorithm 7) pair.

    ``gd_steps``: Algorithm 6's k. ``b_norm``: Algorithm 7's budget (data units²);
    ``base_steps = ⌊B_norm/C²⌋`` steps before the checks start; ``k_max = base_steps +
    check_every·(checks − 1)`` (``base_steps + extra_steps`` without checks). ``epsilon_gd`` /
    ``epsilon_filtered``: the (ε, δ) each run actually satisfies (GDP conversion of its total
    ρ), both <= the target ``epsilon`` — for ``protocol = "paper"`` the filtered one leaves out
    the exact checks (``checks_private`` False).
    """

    protocol: str
    checks_private: bool

    epsilon: float
    delta: float
    clip: float
    sigma: float
    learning_rate: float
    gd_steps: int
    b_norm: float
    base_steps: int
    k_max: int
    checks: int
    check_every: int
    check_sigma: float
    rho_target: float
    rho_gd: float
    rho_filter: float
    rho_checks: float
    epsilon_gd: float
    epsilon_filtered: float
    conversion: str

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_gd(
    epsilon: float,
    delta: float,
    *,
    clip: float,
    sigma: float,
    learning_rate: float,
    checks: int = 8,
    check_every: int = 5,
    check_fraction: float = 0.1,
    extra_steps: int = 35,
    protocol: str = "private-checks",
) -> GDPlan:
    """Calibrate Algorithm 6's k and Algorithm 7's B_norm and check noise to (ε, δ)."""
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be > 0, got sigma={sigma!r}")
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be > 0, got clip={clip!r}")
    if checks < 0 or check_every < 1 or extra_steps < 0:
        raise ValueError(
            f"need checks >= 0, check_every >= 1, extra_steps >= 0, got checks={checks}, "
            f"check_every={check_every}, extra_steps={extra_steps}"
        )
    if not 0.0 < check_fraction < 1.0:
        raise ValueError(f"check_fraction must be in (0, 1), got check_fraction={check_fraction!r}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got protocol={protocol!r}")
    rho, conversion = calibrate_rho(epsilon, delta, "gaussian")
    # Algorithm 6: k/(2σ²) <= ρ (Proposition 5.1, as rho_for_sigma(k·1², σ))
    k = math.floor(2.0 * sigma * sigma * rho)
    while k >= 1 and rho_for_sigma(float(k), sigma) > rho:
        k -= 1
    if k < 1:
        raise ValueError(
            f"sigma={sigma!r} is too large for epsilon={epsilon!r}, delta={delta!r}: not even one "
            f"step of private GD fits (rho={rho!r})"
        )
    noise = sigma * clip
    if protocol == "paper":
        # Appendix A: B_norm = k·C², exact checks from step k (not paid for)
        check_sigma, rho_checks = 0.0, 0.0
        b_norm = float(k) * clip * clip
        base_steps = k
        k_max = k + (check_every * (checks - 1) if checks else 0)
    else:
        # Algorithm 7: the checks first, then the filter gets what is left
        if checks:
            check_sigma = sigma_for_rho(float(checks), check_fraction * rho)
            rho_checks = rho_for_sigma(float(checks), check_sigma)
        else:
            check_sigma, rho_checks = math.inf, 0.0
        b_norm = 2.0 * noise * noise * (rho - rho_checks)
        while rho_for_sigma(b_norm, noise) + rho_checks > rho:
            b_norm = math.nextafter(b_norm, 0.0) * (1.0 - 1e-12)
        base_steps = math.floor(b_norm / (clip * clip))
        k_max = base_steps + (check_every * (checks - 1) if checks else extra_steps)
    if base_steps < 1:
        raise ValueError(
            f"B_norm={b_norm!r} is below one step's C²={clip * clip!r}: lower check_fraction or sigma"
        )
    rho_gd = rho_for_sigma(float(k), sigma)
    rho_filter = rho_for_sigma(b_norm, noise)
    return GDPlan(
        protocol=protocol,
        checks_private=protocol != "paper",
        epsilon=float(epsilon),
        delta=float(delta),
        clip=float(clip),
        sigma=float(sigma),
        learning_rate=float(learning_rate),
        gd_steps=k,
        b_norm=b_norm,
        base_steps=base_steps,
        k_max=k_max,
        checks=checks,
        check_every=check_every,
        check_sigma=check_sigma,
        rho_target=rho,
        rho_gd=rho_gd,
        rho_filter=rho_filter,
        rho_checks=rho_checks,
        epsilon_gd=epsilon_from_rho_gdp(rho_gd, delta),
        epsilon_filtered=epsilon_from_rho_gdp(rho_filter + rho_checks, delta),
        conversion=conversion,
    )
