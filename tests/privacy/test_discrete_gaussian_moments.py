"""The discrete Gaussian's reported moments: the half-width against a 40-digit sum of the pmf,
the variance exact and slightly below ``sigma2_units``, and both computation paths agreeing."""

from __future__ import annotations

import functools
import math

import mpmath
import pytest
from scipy import stats

from streamfilter.privacy import discrete_gaussian_moments as moments
from streamfilter.privacy.discrete_gaussian_moments import (
    discrete_gaussian_halfwidth,
    discrete_gaussian_variance,
)


def _direct_mass(s2: float) -> tuple[list[float], float]:
    lim = int(40 * math.sqrt(s2)) + 40
    w = [math.exp(-(y * y) / (2 * s2)) for y in range(0, lim + 1)]
    return w, w[0] + 2 * math.fsum(w[1:])


@functools.cache
def _mp_mass(s2: int) -> tuple[list, object]:
    """pmf weights f(0..L) and total mass in 40-digit arithmetic (tail beyond L < 1e-60)."""
    lim = int(17 * math.sqrt(s2)) + 40
    with mpmath.workdps(40):
        f = [mpmath.exp(-mpmath.mpf(y * y) / (2 * s2)) for y in range(lim + 1)]
        return f, f[0] + 2 * mpmath.fsum(f[1:])


def _halfwidth_mp(s2: int, coverage: float) -> int:
    f, total = _mp_mass(s2)
    with mpmath.workdps(40):
        target = mpmath.mpf(coverage) * total
        k, acc = 0, f[0]
        while acc < target:
            k += 1
            acc += 2 * f[k]
        return k


@pytest.mark.parametrize("s2", [1, 2, 3, 10, 50, 1000, 12345])
@pytest.mark.parametrize("coverage", [0.3, 0.5, 0.9, 0.95, 0.99, 0.999, 1 - 1e-9, 1 - 2**-53])
def test_halfwidth_matches_high_precision_pmf_sum(s2, coverage):
    assert discrete_gaussian_halfwidth(s2, coverage) == _halfwidth_mp(s2, coverage)


def test_halfwidth_large_variance():
    for s2 in (10**8, 10**12, 2**50, 2**62):
        for coverage in (0.5, 0.95, 1 - 1e-12):
            k = discrete_gaussian_halfwidth(s2, coverage)
            assert abs(k - stats.norm.isf((1 - coverage) / 2) * math.sqrt(s2)) <= 2, s2


def test_halfwidth_summation_and_euler_maclaurin_paths_agree(monkeypatch):
    # two independent methods inside the module: term-by-term sums and erf/erfc + corrections
    cases = [(s2, c) for s2 in (2**20 + 1, 10**7) for c in (0.3, 0.9, 0.95, 0.999999)]
    em = [moments._halfwidth_cached.__wrapped__(s2, c) for s2, c in cases]
    monkeypatch.setattr(moments, "_HALFWIDTH_SUM_MAX", 2**30)
    summed = [moments._halfwidth_cached.__wrapped__(s2, c) for s2, c in cases]
    assert summed == em


def test_halfwidth_rejects_bad_coverage():
    for bad in (0.0, 1.0, -0.1, math.nan):
        with pytest.raises(ValueError):
            discrete_gaussian_halfwidth(10, bad)


@pytest.mark.parametrize("s2", [1, 2, 3, 50, 1000])
def test_variance_is_exact_and_slightly_below_s2(s2):
    w, total = _direct_mass(s2)
    second = 2 * math.fsum(y * y * wy for y, wy in enumerate(w)) / total
    v = discrete_gaussian_variance(s2)
    assert v == pytest.approx(second, rel=1e-13)
    assert v <= s2
    if s2 <= 2:  # the gap ~ 8 pi^2 s2^2 exp(-2 pi^2 s2) is below float64 resolution beyond
        assert v < s2
    if s2 == 1:
        assert 1 - v == pytest.approx(2.112e-7, rel=1e-3)  # ~ 8 pi^2 exp(-2 pi^2)


def test_variance_summation_and_dual_series_agree():
    for s2 in (1, 7, 2**20, 2**21):
        a, b = moments.theta_dual(float(s2))
        assert moments._variance_by_sum(s2) == pytest.approx(s2 * b / a, rel=1e-13)
    assert discrete_gaussian_variance(10**12) == pytest.approx(1e12, rel=1e-15)
    with pytest.raises(ValueError):
        discrete_gaussian_variance(0)
