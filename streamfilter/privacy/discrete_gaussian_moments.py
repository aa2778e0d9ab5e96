"""Exact moments and half-widths of the discrete Gaussian ``N_Z(0, sigma2_units)`` (Canonne,
Kamath and Steinke 2020, "CKS"), for reporting only: the variance and the 95% half-width each
release states. Sampling is ``privacy/noise.py``; nothing here draws or decides anything.
"""

from __future__ import annotations

import functools
import math
from typing import Final

import numpy as np

from streamfilter.privacy.normal import normal_quantile

__all__ = ["discrete_gaussian_halfwidth", "discrete_gaussian_variance", "theta_dual"]


def theta_dual(s2: float) -> tuple[float, float]:
    """Poisson-summation factors (A, B) with, for f(y) = exp(-y^2/(2 s2)),

    sum_y f(y) = sqrt(2 pi s2) * A,   A = sum_k exp(-2 pi^2 s2 k^2),
    sum_y y^2 f(y) = sqrt(2 pi s2) * s2 * B,   B = sum_k (1 - 4 pi^2 s2 k^2) exp(-2 pi^2 s2 k^2),
    (k over all integers). The k != 0 terms are below 3e-9 for s2 >= 1 and vanish fast.
    """
    a = 1.0
    b = 1.0
    k = 1
    while True:
        e = math.exp(-2.0 * math.pi**2 * s2 * k * k)
        if e == 0.0:
            return a, b
        a += 2.0 * e
        b += 2.0 * (1.0 - 4.0 * math.pi**2 * s2 * k * k) * e
        k += 1


def _check_sigma2_units(s2: int) -> int:
    if isinstance(s2, bool) or not isinstance(s2, int | np.integer):
        raise TypeError(f"sigma2_units must be an integer, got {s2!r}")
    if int(s2) < 1:
        raise ValueError(f"sigma2_units must be >= 1, got sigma2_units={s2}")
    return int(s2)


def _pmf_cutoff(s2: int) -> int:
    """|y| beyond which exp(-y^2/(2 s2)) < exp(-745) (underflows in float64)."""
    return math.isqrt(2 * s2 * 745) + 2


def _variance_by_sum(s2: int) -> float:
    """Var of N_Z(0, s2) by summing the pmf over |y| <= cutoff (math.fsum: correctly rounded)."""
    y = np.arange(1, _pmf_cutoff(s2) + 1, dtype=np.float64)
    w = np.exp(-(y * y) / (2.0 * s2))
    return 2.0 * math.fsum((y * y * w).tolist()) / (1.0 + 2.0 * math.fsum(w.tolist()))


def discrete_gaussian_variance(sigma2_units: int) -> float:
    """Exact variance of N_Z(0, sigma2_units) (slightly below ``sigma2_units``).

    Summing the pmf for ``sigma2_units <= 2**20``; above that by the Poisson-summation identity
    of :func:`theta_dual` (the same series, summed on the dual side, where it converges in one
    term), for which the relative gap to ``sigma2_units`` is far below float64 resolution.
    """
    return _variance_cached(_check_sigma2_units(sigma2_units))


@functools.lru_cache(maxsize=1024)
def _variance_cached(s2: int) -> float:
    if s2 <= 1 << 20:
        return _variance_by_sum(s2)
    a, b = theta_dual(float(s2))
    return float(s2) * b / a


_HALFWIDTH_SUM_MAX: Final = 1 << 20  # sum the pmf term by term up to here (<= ~80k terms)


def discrete_gaussian_halfwidth(sigma2_units: int, coverage: float = 0.95) -> int:
    """Smallest integer k with P(|Z| <= k) >= coverage for Z ~ N_Z(0, sigma2_units).

    Numerically careful for any ``sigma2_units`` (tested up to 2**62): the comparison is made on
    the head mass P(|Z| <= k) when ``coverage <= 1/2`` and on the tail mass P(|Z| > k) against
    ``1 - coverage`` (exact in float64 then) otherwise, so nothing cancels. The total mass is the
    Poisson-summation series of :func:`theta_dual`.
    * ``sigma2_units <= 2**20``: the pmf is summed term by term (tails summed from the far end,
      smallest terms first).
    * above: the pmf sums are the Gaussian integrals (``math.erf``/``math.erfc``) plus their
      Euler–Maclaurin corrections through the third derivative: the remainder is
      O((k/s2)^5 f(k)), below 1e-18 of a pmf step here, whereas summing 1e6 to 1e10 terms would
      only add rounding error.
    """
    s2 = _check_sigma2_units(sigma2_units)
    if not 0.0 < coverage < 1.0:
        raise ValueError(f"coverage must be in (0, 1), got coverage={coverage}")
    return _halfwidth_cached(s2, float(coverage))


@functools.lru_cache(maxsize=1024)
def _halfwidth_cached(s2: int, coverage: float) -> int:
    total = math.sqrt(2.0 * math.pi * s2) * theta_dual(float(s2))[0]  # sum_y f(y)
    use_tail = coverage > 0.5
    target = ((1.0 - coverage) if use_tail else coverage) * total
    if s2 <= _HALFWIDTH_SUM_MAX:
        y = np.arange(0, _pmf_cutoff(s2) + 1, dtype=np.float64)
        f = np.exp(-(y * y) / (2.0 * s2))
        if use_tail:  # tail[k] = 2 * sum_{y > k} f(y), accumulated from the far end
            tail = 2.0 * np.concatenate([np.cumsum(f[:0:-1])[::-1], [0.0]])
            return int(np.flatnonzero(tail <= target)[0])
        head = f[0] + 2.0 * np.concatenate([[0.0], np.cumsum(f[1:])])  # sum_{|y| <= k} f(y)
        return int(np.flatnonzero(head >= target)[0])
    sigma = math.sqrt(s2)
    root2s = sigma * math.sqrt(2.0)
    gauss = sigma * math.sqrt(math.pi / 2.0)

    def ok(k: int) -> bool:
        fk = math.exp(-(k * k) / (2.0 * s2))
        d1 = -(k / s2) * fk  # f'(k)
        d3 = (3.0 * k / s2**2 - (k / s2) ** 3) * fk  # f'''(k)
        if use_tail:  # 2 sum_{y > k} f(y) = 2 (int_k^inf f - f(k)/2 - f'(k)/12 + f'''(k)/720)
            tail = 2.0 * (gauss * math.erfc(k / root2s) - fk / 2.0 - d1 / 12.0 + d3 / 720.0)
            return tail <= target
        # sum_{|y| <= k} f(y) = 2 (int_0^k f + (1 + f(k))/2 + f'(k)/12 - f'''(k)/720) - 1
        head = 2.0 * (gauss * math.erf(k / root2s) + (1.0 + fk) / 2.0 + d1 / 12.0 - d3 / 720.0)
        return head - 1.0 >= target

    z = normal_quantile(0.5 + coverage / 2.0)  # the search's start only
    k = max(0, int(z * sigma) - 2)
    while not ok(k):
        k += 1
    while k > 0 and ok(k - 1):
        k -= 1
    return k
