"""Accuracy statements for released answers (pure math).

These are *utility* statements about the noise, not privacy claims, but they are still stated
only as far as a proof supports them.

* :func:`linf_bound` — Corollary 4.7 of Feldman & Zrnic: with ``σ² = B_norm/(2ρ)``, each
  answer is within ``sqrt(B_norm·log(d/δ)/ρ)`` of the sum over the *active set* (users still
  admitted, with their lattice-rounded contributions) in ℓ∞, except with probability δ.
* :func:`gaussian_halfwidth` — the two-sided central interval of one coordinate's noise.
"""

from __future__ import annotations

import math
import numbers

from streamfilter.privacy.accounting import MECHANISMS, Mechanism
from streamfilter.privacy.normal import normal_quantile

__all__ = ["gaussian_halfwidth", "linf_bound", "linf_bound_for_variance"]


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {name}={value!r}")
    return float(value)


def linf_bound(
    b_norm: float, rho: float, d: int, delta: float, *, mechanism: Mechanism = "gaussian"
) -> float:
    """ℓ∞ error bound holding with probability ``>= 1 − δ`` for one ``d``-dimensional answer.

    ``mechanism="gaussian"`` (continuous): ``sqrt(B_norm·log(d/δ)/ρ)``, exactly Corollary 4.7.
    With ``σ² = B_norm/(2ρ)`` this is ``λ = σ·sqrt(2·log(d/δ))``; the Gaussian tail
    ``P[|Z| > λ] <= exp(−λ²/(2σ²)) = δ/d`` (from ``Q(t) <= ½·exp(−t²/2)``) and a union bound over
    the d coordinates give δ.

    ``mechanism="discrete_gaussian"``: ``sqrt(B_norm·log(2d/δ)/ρ)``. The discrete Gaussian
    ``N_Z(0, s²)`` is ``s²``-sub-Gaussian (CKS 2020: ``E[e^{tX}] <= e^{t²s²/2}``), which gives the
    *one-sided* tail ``P[X >= λ] <= exp(−λ²/(2s²))`` — a factor 2 weaker than the continuous
    two-sided tail used above. So the union bound runs over 2d one-sided events, hence ``2d``.
    (The continuous formula can fail for the discrete Gaussian at small ``s``: for ``s = 0.5``,
    ``P[|X| > 0.999] ≈ 0.213 > exp(−0.999²/(2·0.25)) ≈ 0.136``.) In lattice units with
    ``s = σ/γ`` the released noise ``γ·X`` is ``σ²``-sub-Gaussian, so the same formula holds in
    data units.

    The bound is relative to the sum of the lattice-rounded contributions of the active set.
    """
    b = _real("b_norm", b_norm)
    if not (math.isfinite(b) and b > 0.0):
        raise ValueError(f"b_norm must be finite and > 0, got b_norm={b_norm!r}")
    r = _real("rho", rho)
    if not (math.isfinite(r) and r > 0.0):
        raise ValueError(f"rho must be finite and > 0, got rho={rho!r}")
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
        raise ValueError(f"d must be an integer >= 1, got d={d!r}")
    p = _real("delta", delta)
    if not 0.0 < p < 1.0:
        raise ValueError(f"delta must be in (0, 1), got delta={delta!r}")
    if mechanism not in MECHANISMS:
        raise ValueError(
            f"mechanism must be one of {', '.join(MECHANISMS)}, got mechanism={mechanism!r}"
        )
    events = int(d) if mechanism == "gaussian" else 2 * int(d)
    log_term = math.log(events) - math.log(p)
    bound = math.sqrt(b * log_term / r)
    return math.nextafter(bound, math.inf)  # round up: an error bound may only be loosened


def linf_bound_for_variance(
    variance: float, d: int, beta: float, *, mechanism: Mechanism = "gaussian"
) -> float:
    """:func:`linf_bound` for the noise actually drawn: ``sqrt(2·v·log(k/β))`` with ``v`` the
    noise's variance (continuous) or sub-Gaussian variance proxy (the ``s²``·γ² of ``N_Z(0, s²)``
    on the lattice γZ, or a sum of such), and ``k = d`` (continuous) or ``2d`` (sub-Gaussian,
    one-sided tails; see :func:`linf_bound`). With ``v = B_norm/(2ρ)`` this is exactly
    :func:`linf_bound` — Corollary 4.7 of Feldman & Zrnic — and the lattice's upward rounding of
    ``v`` only loosens it, as it must. Rounded up.
    """
    v = _real("variance", variance)
    if not (math.isfinite(v) and v >= 0.0):
        raise ValueError(f"variance must be finite and >= 0, got variance={variance!r}")
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
        raise ValueError(f"d must be an integer >= 1, got d={d!r}")
    p = _real("beta", beta)
    if not 0.0 < p < 1.0:
        raise ValueError(f"beta must be in (0, 1), got beta={beta!r}")
    events = int(d) if mechanism == "gaussian" else 2 * int(d)
    bound = math.sqrt(2.0 * v * (math.log(events) - math.log(p)))
    return math.nextafter(bound, math.inf)


def gaussian_halfwidth(sigma: float, coverage: float = 0.95) -> float:
    """Half-width ``h = Φ⁻¹((1 + coverage)/2)·σ`` with ``P[|Z| <= h] = coverage`` for
    ``Z ~ N(0, σ²)``.

    Exact for the continuous Gaussian. For the discrete Gaussian it is only the normal
    approximation (accurate when ``σ/γ`` is large, which is the usual regime); use an exact
    discrete computation where the interval must be guaranteed. ``σ = 0`` gives 0.
    """
    s = _real("sigma", sigma)
    if not (math.isfinite(s) and s >= 0.0):
        raise ValueError(f"sigma must be finite and >= 0, got sigma={sigma!r}")
    c = _real("coverage", coverage)
    if not 0.0 < c < 1.0:
        raise ValueError(f"coverage must be in (0, 1), got coverage={coverage!r}")
    return normal_quantile((1.0 + c) / 2.0) * s
