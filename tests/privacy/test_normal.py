"""``privacy.normal.normal_quantile``: the same bits as ``scipy.special.ndtri`` everywhere.

The released error bars come from it (``accuracy.gaussian_halfwidth``), so a changed last bit
would change a release: each branch of the algorithm, both tails, the hand-over points and the
subnormal range are compared bit for bit with scipy, and the result is checked against the
normal CDF (from ``math.erfc``) independently of scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special

from streamfilter.privacy.normal import normal_quantile

_EXP_MINUS_2 = math.exp(-2.0)
_EXP_MINUS_32 = math.exp(-32.0)


def _arguments() -> np.ndarray:
    rng = np.random.default_rng(20261127)
    edges = []
    for edge in (_EXP_MINUS_2, 1.0 - _EXP_MINUS_2, _EXP_MINUS_32, 1.0 - _EXP_MINUS_32, 0.5):
        below = above = edge
        for _ in range(50):  # the 50 doubles each side of a hand-over point
            below, above = math.nextafter(below, 0.0), math.nextafter(above, 1.0)
            edges += [below, above]
    z8 = math.exp(-32.0)  # z = sqrt(-2 log y) = 8: the two tail fits meet
    ps = np.concatenate(
        [
            rng.random(200_000),  # mostly the central fit
            10.0 ** -rng.uniform(0.0, 323.0, 200_000),  # the lower tail, into subnormals
            1.0 - 10.0 ** -rng.uniform(0.0, 16.0, 100_000),  # the upper tail
            z8 * rng.uniform(0.5, 2.0, 20_000),
            np.array(edges),
            np.array([5e-324, 2.2250738585072014e-308, 0.025, 0.975, 0.5, 0.05, 0.95]),
        ]
    )
    return ps[(ps > 0.0) & (ps < 1.0)]


def test_equals_scipy_ndtri_bit_for_bit() -> None:
    ps = _arguments()
    ours = np.fromiter(map(normal_quantile, ps.tolist()), np.float64, len(ps))
    theirs = scipy.special.ndtri(ps)
    differ = np.flatnonzero(ours.view(np.int64) != theirs.view(np.int64))
    assert len(differ) == 0, np.c_[ps[differ], ours[differ], theirs[differ]][:5]


def test_inverts_the_normal_cdf() -> None:
    """Φ(Φ⁻¹(p)) = p to a few ulps of p, with Φ from ``math.erfc`` (not scipy)."""
    rng = np.random.default_rng(7)
    for p in [*rng.random(2_000).tolist(), 1e-10, 1e-100, 1e-300, 0.975, 0.5]:
        x = normal_quantile(p)
        cdf = 0.5 * math.erfc(-x / math.sqrt(2.0))
        assert cdf == pytest.approx(p, rel=1e-12), (p, x)
        if 1e-3 <= p <= 1.0 - 1e-3:  # where 1 - p loses no more than an ulp of the tail
            assert normal_quantile(1.0 - p) == pytest.approx(-x, rel=1e-9, abs=1e-12)


def test_ends_and_domain() -> None:
    assert normal_quantile(0.0) == -math.inf
    assert normal_quantile(1.0) == math.inf
    assert normal_quantile(0.5) == 0.0
    assert normal_quantile(0.975) == pytest.approx(1.959963984540054, rel=1e-15)
    for bad in (-1e-300, 1.0000000000000002, math.nan, -math.inf):
        with pytest.raises(ValueError, match="p must be in"):
            normal_quantile(bad)
