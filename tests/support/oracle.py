"""Independent oracles for the statistical tests of noise.

A statistical test of a mechanism compares the spread of the errors it draws with a variance the
*test* computes from the configuration and the cited formula (never with the σ the code reports:
a wrong calibration would then agree with itself). The comparison is two-sided:

    Σ e_i² / V  ~  χ²_n        for n independent N(0, V) errors e_i with known mean 0,

accepted inside the central ``1 − α`` of χ²_n. With ``α = 10⁻³`` a correct implementation passes
with probability ``>= 0.999``; :func:`miss_probability` is the probability that a variance off by
a factor ``k`` (σ off by √k) still passes, so a test states ``miss_probability(n, 2) <= 10⁻³`` and
``miss_probability(n, 1/2) <= 10⁻³`` to show that σ off by √2 in either direction fails with
probability ``>= 0.999``. Several checks in one test share α (Bonferroni: each gets ``α/checks``).

The discrete Gaussian ``N_Z(0, s²)`` (Canonne, Kamath & Steinke 2020, Definition 1) has variance
slightly below ``s²``; :func:`discrete_gaussian_variance` sums it from the definition. Its errors
are not exactly normal, but for ``s² >= 1`` their kurtosis is within 10⁻⁶ of the normal's, so the
χ² band holds to well within the stated probabilities.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

#: probability that a correct implementation fails one test
ALPHA = 1e-3
#: probability that σ off by √2 (either way) must fail one test with
POWER = 0.999


def discrete_gaussian_variance(s2: float) -> float:
    """``Var N_Z(0, s²)`` by direct summation of ``exp(−x²/(2s²))`` over the integers."""
    m = int(40 * math.sqrt(s2)) + 40
    x = np.arange(-m, m + 1, dtype=np.float64)
    w = np.exp(-(x**2) / (2.0 * s2))
    return float((w * x**2).sum() / w.sum())


def band(n: int, alpha: float = ALPHA, checks: int = 1) -> tuple[float, float]:
    """Acceptance band for ``Σe²/V`` (χ²_n), two-sided at level ``alpha/checks``."""
    a = alpha / checks
    return float(stats.chi2.ppf(a / 2, n)), float(stats.chi2.isf(a / 2, n))


def miss_probability(n: int, factor: float, alpha: float = ALPHA, checks: int = 1) -> float:
    """P[a variance ``factor·V`` passes the check against ``V``] with ``n`` errors."""
    lo, hi = band(n, alpha, checks)
    return float(stats.chi2.cdf(hi / factor, n) - stats.chi2.cdf(lo / factor, n))


def assert_power(n: int, alpha: float = ALPHA, checks: int = 1) -> None:
    """The check with ``n`` errors fails σ·√2 and σ/√2 with probability ``>= POWER`` each."""
    for factor in (2.0, 0.5):
        miss = miss_probability(n, factor, alpha, checks)
        assert miss <= 1 - POWER, f"n={n} errors miss a variance ×{factor} with p={miss:.2g}"


def assert_variance(
    errors: np.ndarray, variance: float, alpha: float = ALPHA, checks: int = 1
) -> None:
    """Two-sided χ² check that mean-zero ``errors`` have variance ``variance`` (the oracle's)."""
    e = np.asarray(errors, dtype=np.float64).ravel()
    n = e.size
    assert_power(n, alpha, checks)
    stat = float(e @ e) / variance
    lo, hi = band(n, alpha, checks)
    ratio = stat / n
    assert lo <= stat <= hi, (
        f"sample variance / oracle variance = {ratio:.4f}, outside [{lo / n:.4f}, {hi / n:.4f}] "
        f"(n={n}, oracle variance {variance:.6g})"
    )


def assert_mean_zero(errors: np.ndarray, variance: float, checks: int = 1) -> None:
    """The errors' mean is 0 within the two-sided normal band at ``ALPHA/checks``."""
    e = np.asarray(errors, dtype=np.float64).ravel()
    z = float(stats.norm.isf(ALPHA / checks / 2))
    assert abs(e.mean()) <= z * math.sqrt(variance / e.size), (e.mean(), variance, e.size)
