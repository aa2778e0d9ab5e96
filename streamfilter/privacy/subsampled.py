"""Rényi DP of the Poisson-subsampled Gaussian mechanism, and RDP → (ε, δ) conversion.

Pure math (numpy and scipy only): no I/O, no state.

The mechanism (Yu et al. 2023, eqs. (1)–(2); Mironov, Talwar & Zhang 2019, "MTZ" below): each
example enters the sum with probability ``q`` (Poisson sampling) and the sum gets
``N(0, (z·Δ)² I)``, where ``Δ`` is the example's (clipped) gradient norm and ``z`` the noise
multiplier relative to it. With ``μ₀ = N(0, z²)`` and ``μ₁ = N(1, z²)`` (unit sensitivity after
scaling), the order-α RDP is ``D_α((1−q)μ₀ + qμ₁ ‖ μ₀)`` — MTZ Theorem 5 shows this direction
dominates the reverse one for the orders used here — and

    A_α = E_{x∼μ₀}[((1−q) + q·exp((2x−1)/(2z²)))^α],      RDP(α) = log(A_α)/(α−1).

Integer α (MTZ §3.2, binomial expansion, exact up to floating point):

    A_α = Σ_{k=0..α} C(α,k)·(1−q)^{α−k}·q^k·exp((k²−k)/(2z²)),

summed in log space (``logsumexp``), so it neither overflows nor loses the small terms.

Fractional α (numerical integration, rounded up): with ``x = z·u``, ``u ∼ N(0, 1)`` and
``w(u) = q·expm1(u/z − 1/(2z²))`` (so ``1 + w`` is the mixture's likelihood ratio and
``E[w] = 0``),

    A_α − 1 = E_u[(1 + w)^α − 1 − α·w],

whose integrand is ≥ 0 everywhere (convexity of ``t ↦ t^α``), so the sum has no cancellation
and ``A_α − 1`` keeps its relative precision even when the RDP is 1e-12. The integral is the
trapezoidal rule on a uniform grid of step ``min(0.05, z/8)`` over ``[−15, α/z + 15]`` (the
integrand is ``φ(u)`` times a function analytic in the strip ``|Im u| < πz``, so the trapezoid
error is ``exp(−2π·d/step)`` with ``d ≈ min(πz/2, 3)``: below 1e-30 relative; the tails outside
the interval are below ``2^α·e^{−112}``). Each value is then rounded up by a relative 1e-9 plus
an absolute allowance for the summation's float error, and capped by the convexity bound
(``α ↦ log A_α`` is a cumulant generating function, hence convex: ``log A_α ≤ (1−t)·log A_a +
t·log A_{a+1}`` for ``a = ⌊α⌋``, ``t = α − a``, ``log A_1 = 0``), which is itself an upper bound,
so the minimum of two upper bounds is reported. ``tests/privacy/test_subsampled.py`` checks the
result against an independent mpmath quadrature: never below it, within 1e-6 relative.

Conversion (:func:`epsilon_from_rdp`): for every order α > 1, (α, ρ)-RDP implies (ε, δ)-DP with

    ε = ρ + log((α−1)/α) − (log δ + log α)/(α−1)

(Canonne, Kamath & Steinke 2020, Proposition 12; Asoodeh et al. 2021; Balle et al. 2020,
Theorem 21). It is at most the classical ``ρ + log(1/δ)/(α−1)`` (Mironov 2017, Proposition 3)
for every α > 1 (both extra terms are ≤ 0), and the minimum over orders is taken; since each
per-order bound is itself a theorem, the minimiser only affects tightness, not soundness.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special

__all__ = ["epsilon_from_rdp", "epsilon_from_rdp_classical", "rdp_poisson_gaussian"]

#: Largest order accepted (the binomial sum has α+1 terms).
MAX_ORDER = 4096
#: Relative upward margin on every reported RDP or ε value (covers the float error of the
#: logsumexp of ≤ MAX_ORDER terms, each a handful of correctly rounded operations).
_MARGIN = 1e-9


def _check_orders(orders: object) -> np.ndarray:
    a = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"orders must be a non-empty 1-D sequence, got orders={orders!r}")
    if not (np.all(np.isfinite(a)) and np.all(a > 1.0) and np.all(a <= MAX_ORDER)):
        raise ValueError(f"orders must be finite and in (1, {MAX_ORDER}], got orders={orders!r}")
    return a


def _log_a_integer(q: float, z: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """``log A_α`` (MTZ §3.2) for integer orders ``alphas`` ≥ 1 and noise multipliers ``z``.

    Returns shape (len(z), len(alphas)). ``z`` finite and > 0, ``0 < q < 1``.
    """
    kmax = int(alphas.max())
    k = np.arange(kmax + 1, dtype=np.float64)
    a = alphas[:, None]  # (A, 1)
    valid = k[None, :] <= a  # (A, K)
    a_safe = np.where(valid, a, k[None, :])
    log_binom = (
        scipy.special.gammaln(a_safe + 1)
        - scipy.special.gammaln(k[None, :] + 1)
        - scipy.special.gammaln(a_safe - k[None, :] + 1)
    )
    base = log_binom + (a_safe - k[None, :]) * math.log1p(-q) + k[None, :] * math.log(q)
    base = np.where(valid, base, -np.inf)  # (A, K)
    quad = (k * k - k)[None, :] / (2.0 * z[:, None] ** 2)  # (Z, K)
    terms = base[None, :, :] + quad[:, None, :]  # (Z, A, K)
    out: np.ndarray = scipy.special.logsumexp(terms, axis=2)
    return out


#: Half-width (in standard deviations of ``u``) beyond the two bumps at 0 and α/z.
_TAIL_SD = 15.0
#: Terms of the binomial series of ``(1 + w)^α − 1 − α·w`` used when ``|w| < _SERIES_BELOW``.
_SERIES_TERMS = 8
_SERIES_BELOW = 1e-3
#: Most quadrature nodes per chunk of noise multipliers (and per noise multiplier).
_MAX_NODES = 2**21


def _log_a_minus_1_fractional(q: float, z: np.ndarray, alpha: float) -> np.ndarray:
    """``log(A_α − 1)`` per noise multiplier in ``z`` by the trapezoidal rule on
    ``E_u[(1+w)^α − 1 − α·w]`` (module docstring); ``-inf`` where it is 0 in floating point.

    ``0 < q < 1``, ``z`` finite and > 0, ``α > 1``. Every z gets the same number of nodes M
    (its own step ``(α/z + 30)/(M−1) <= min(0.05, z/8)``), so a batch is one (Z, M) array. The
    integrand is formed in log space: it neither overflows for large ``α/z`` nor loses small
    values.
    """
    width = alpha / z + 2.0 * _TAIL_SD
    need = width / np.minimum(0.05, z / 8.0)
    m = int(np.ceil(need.max())) + 1
    step = width / (m - 1)
    u = -_TAIL_SD + step[:, None] * np.arange(m)[None, :]  # (Z, M)
    zz = z[:, None]
    w = q * np.expm1(u / zz - 1.0 / (2.0 * zz * zz))  # > −1 everywhere (q < 1)
    log_g = np.empty_like(u)
    small = np.abs(w) < _SERIES_BELOW
    # |w| small: Σ_{k≥2} C(α, k)·w^k (the terms shrink by a factor ≥ 1/(|w|·α) per k, so 8
    # terms are exact to float precision for |w| < 1e-3 and α ≤ MAX_ORDER/…; the sum is ≥ 0)
    ws = w[small]
    total = np.zeros_like(ws)
    coef = alpha * (alpha - 1.0) / 2.0
    power = ws * ws
    for k in range(2, 2 + _SERIES_TERMS):
        total += coef * power
        coef *= (alpha - k) / (k + 1.0)
        power = power * ws
    with np.errstate(divide="ignore"):
        log_g[small] = np.log(np.maximum(total, 0.0))
    wb = w[~small]
    a_log_h = alpha * np.log1p(wb)
    moderate = a_log_h <= 1.0
    out = np.empty_like(wb)
    # (1+w)^α ≤ e: the direct difference (relative error ≤ 2^-52·α|w|/g: tiny for |w| ≥ 1e-3)
    with np.errstate(divide="ignore"):
        out[moderate] = np.log(np.maximum(np.expm1(a_log_h[moderate]) - alpha * wb[moderate], 0.0))
    # (1+w)^α > e: log g = α·log(1+w) + log1p(−(1 + α·w)·(1+w)^−α), the ratio in (0, 1)
    big = ~moderate
    ratio = (1.0 + alpha * wb[big]) * np.exp(-a_log_h[big])
    out[big] = a_log_h[big] + np.log1p(-np.minimum(ratio, 1.0 - 2.0**-52))
    log_g[~small] = out
    log_phi = -0.5 * u * u - 0.5 * math.log(2.0 * math.pi)
    result: np.ndarray = scipy.special.logsumexp(log_phi + log_g, axis=1) + np.log(step)
    return result


def _fractional_log_a(q: float, z: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """``log A_α`` for fractional ``alphas``, one row per noise multiplier (chunks of z keep
    the (Z, M) arrays near 2^21 nodes)."""
    out = np.full((z.size, alphas.size), np.inf)  # inf: left to the convexity bound
    for j, a in enumerate(alphas):
        need = (a / z + 2.0 * _TAIL_SD) / np.minimum(0.05, z / 8.0)
        ok = np.flatnonzero(need <= _MAX_NODES)  # tiny z (α/z huge): the convexity bound only
        if ok.size == 0:
            continue
        chunk = max(1, _MAX_NODES // (int(need[ok].max()) + 2))
        for i in range(0, ok.size, chunk):
            rows = ok[i : i + chunk]
            log_am1 = _log_a_minus_1_fractional(q, z[rows], float(a))
            # log A = log(1 + (A − 1)); the float error of the pairwise sum of ≤ 2^21
            # non-negative terms (each a few correctly rounded operations) is far inside the
            # relative 1e-9 the caller applies
            out[rows, j] = np.logaddexp(0.0, log_am1)
    return out


def rdp_poisson_gaussian(
    sampling_rate: float, noise_multiplier: float | np.ndarray, orders: object
) -> np.ndarray:
    """Order-α RDP of the Poisson-subsampled Gaussian (MTZ 2019; see the module docstring).

    ``sampling_rate`` q ∈ [0, 1]; ``noise_multiplier`` z ≥ 0 (noise std ÷ sensitivity; a scalar,
    or an array of several, e.g. one per example); ``orders`` α > 1. Returns the RDP per order
    (shape ``(len(orders),)`` for a scalar z, ``z.shape + (len(orders),)`` otherwise), rounded up
    by a relative 1e-9 (plus an absolute ≤ 2^-48 allowance). Integer orders: the exact binomial
    sum; fractional orders: numerical integration, capped by the convexity bound (module
    docstring). Edge cases: q = 0 or z = inf gives 0; z = 0 with q > 0 gives inf; q = 1 gives
    the Gaussian's α/(2z²) (Mironov 2017, Proposition 7).
    """
    q = float(sampling_rate)
    if not (math.isfinite(q) and 0.0 <= q <= 1.0):
        raise ValueError(f"sampling_rate must be in [0, 1], got sampling_rate={sampling_rate!r}")
    alphas = _check_orders(orders)
    z_in = np.asarray(noise_multiplier, dtype=np.float64)
    z = np.atleast_1d(z_in).ravel()
    if np.any(np.isnan(z)) or np.any(z < 0):
        raise ValueError(
            f"noise_multiplier must be >= 0, got noise_multiplier={noise_multiplier!r}"
        )
    out = np.zeros((z.size, alphas.size))
    live = np.isfinite(z) & (z > 0)
    if q > 0.0:
        out[z == 0.0] = np.inf
    if q > 0.0 and live.any():
        zl = z[live]
        if q == 1.0:
            out[live] = alphas[None, :] / (2.0 * zl[:, None] ** 2) * (1.0 + _MARGIN)
        else:
            lo = np.floor(alphas)
            hi = np.ceil(alphas)
            needed = np.unique(np.concatenate([lo, hi]))
            # (Z, U), in chunks of noise multipliers so the (Z, U, α+1) terms stay small
            chunk = max(1, 2**22 // (needed.size * (int(needed.max()) + 1)))
            log_a = np.concatenate(
                [_log_a_integer(q, zl[i : i + chunk], needed) for i in range(0, zl.size, chunk)]
            )
            log_a = np.maximum(log_a, 0.0)  # A_α ≥ 1 (Rényi divergences are ≥ 0)
            log_a[:, needed == 1.0] = 0.0
            idx_lo = np.searchsorted(needed, lo)
            idx_hi = np.searchsorted(needed, hi)
            t = alphas - lo
            convex = (1.0 - t) * log_a[:, idx_lo] + t * log_a[:, idx_hi]  # exact at t = 0
            frac = t > 0
            if frac.any():
                quad = _fractional_log_a(q, zl, alphas[frac])
                convex[:, frac] = np.minimum(convex[:, frac], quad * (1.0 + _MARGIN))
            # relative margin, plus an absolute one for log A_α ≈ 0 (logsumexp's absolute error
            # is a few ulps of 1 per term, i.e. ≤ (α+1)·2^-52, then divided by α − 1)
            slack = (alphas + 1.0) * 2.0**-50 / (alphas - 1.0)
            slack[frac] = 0.0  # quadrature: A − 1 is summed directly, its error is relative
            out[live] = convex / (alphas - 1.0)[None, :] * (1.0 + _MARGIN) + slack[None, :]
    shape = (*z_in.shape, alphas.size)
    return out.reshape(shape)


def _check_delta(delta: float) -> float:
    d = float(delta)
    if not (0.0 < d < 1.0):
        raise ValueError(f"delta must be in (0, 1), got delta={delta!r}")
    return d


def _check_rdp(rdp: object, orders: np.ndarray) -> np.ndarray:
    r = np.asarray(rdp, dtype=np.float64)
    if r.shape[-1:] != orders.shape:
        raise ValueError(
            f"rdp must have one value per order ({orders.size}) in its last axis, got shape {r.shape}"
        )
    if np.any(np.isnan(r)) or np.any(r < 0):
        raise ValueError("rdp values must be >= 0 (not nan)")
    return r


def epsilon_from_rdp(rdp: object, orders: object, delta: float) -> np.ndarray | float:
    """Smallest ε over ``orders`` with (α, rdp_α)-RDP ⇒ (ε, δ)-DP (CKS 2020, Prop. 12).

    ``rdp``: one value per order (last axis), or a (n, len(orders)) array for n examples (then
    one ε per example). Rounded up by a relative 1e-9; never negative; inf RDP gives inf.
    """
    alphas = _check_orders(orders)
    d = _check_delta(delta)
    r = _check_rdp(rdp, alphas)
    eps = r + np.log((alphas - 1.0) / alphas) - (math.log(d) + np.log(alphas)) / (alphas - 1.0)
    best = np.maximum(eps.min(axis=-1), 0.0) * (1.0 + _MARGIN)
    return float(best) if best.ndim == 0 else best


def epsilon_from_rdp_classical(rdp: object, orders: object, delta: float) -> np.ndarray | float:
    """The classical ``min_α rdp_α + log(1/δ)/(α−1)`` (Mironov 2017, Proposition 3).

    Kept for comparison: :func:`epsilon_from_rdp` is never larger (see the module docstring).
    """
    alphas = _check_orders(orders)
    d = _check_delta(delta)
    r = _check_rdp(rdp, alphas)
    eps = r + math.log(1.0 / d) / (alphas - 1.0)
    best = np.maximum(eps.min(axis=-1), 0.0) * (1.0 + _MARGIN)
    return float(best) if best.ndim == 0 else best
