"""The standard normal quantile Φ⁻¹ (pure math, standard library only).

:func:`normal_quantile` is the Cephes ``ndtri`` algorithm (S. L. Moshier, Cephes Math Library
2.1, 1989) — the one ``scipy.special.ndtri`` evaluates — written with the same coefficients and
the same sequence of IEEE double operations, so it returns the same bits as scipy (checked on
millions of arguments across every branch: ``tests/privacy/test_normal.py``). The released error
bars (``accuracy.gaussian_halfwidth``) are computed from it, so the daemon's start and release
paths need no scipy import (~0.2 s; docs/design.md §8.4) and releases stay byte-identical.

Branches: for ``y`` within ``exp(−2)`` of neither end, a rational function of ``(y − ½)²``;
towards either tail, ``z = sqrt(−2 log y)`` and ``x = z − log(z)/z − P(1/z)/(z·Q(1/z))`` with one
rational fit for ``2 ≤ z < 8`` and another for ``8 ≤ z ≤ 64``. Relative error about 1e-16.
"""

from __future__ import annotations

import math

__all__ = ["normal_quantile"]

#: exp(−2): where the central fit hands over to the tail fits
_EXP_MINUS_2 = 0.13533528323661269189
_SQRT_2PI = 2.50662827463100050242

# the central fit: x = √(2π)·(w + w·w²·P0(w²)/Q0(w²)), w = y − ½, |w| ≤ ½ − exp(−2)
_P0 = (
    -5.99633501014107895267e1,
    9.80010754185999661536e1,
    -5.66762857469070293439e1,
    1.39312609387279679503e1,
    -1.23916583867381258016e0,
)
_Q0 = (  # monic: the leading 1 is implicit
    1.95448858338141759834e0,
    4.67627912898881538453e0,
    8.63602421390890590575e1,
    -2.25462687854119370527e2,
    2.00260212380060660359e2,
    -8.20372256168333339912e1,
    1.59056225126211695515e1,
    -1.18331621121330003142e0,
)
# the tail fit for 2 ≤ z < 8 (exp(−32) < y ≤ exp(−2))
_P1 = (
    4.05544892305962419923e0,
    3.15251094599893866154e1,
    5.71628192246421288162e1,
    4.40805073893200834700e1,
    1.46849561928858024014e1,
    2.18663306850790267539e0,
    -1.40256079171354495875e-1,
    -3.50424626827848203418e-2,
    -8.57456785154685413611e-4,
)
_Q1 = (
    1.57799883256466749731e1,
    4.53907635128879210584e1,
    4.13172038254672030440e1,
    1.50425385692907503408e1,
    2.50464946208309415979e0,
    -1.42182922854787788574e-1,
    -3.80806407691578277194e-2,
    -9.33259480895457427372e-4,
)
# the tail fit for 8 ≤ z ≤ 64 (y down to the smallest subnormal)
_P2 = (
    3.23774891776946035970e0,
    6.91522889068984211695e0,
    3.93881025292474443415e0,
    1.33303460815807542389e0,
    2.01485389549179081538e-1,
    1.23716634817820021358e-2,
    3.01581553508235416007e-4,
    2.65806974686737550832e-6,
    6.23974539184983293730e-9,
)
_Q2 = (
    6.02427039364742014255e0,
    3.67983563856160859403e0,
    1.37702099489081330271e0,
    2.16236993594496635890e-1,
    1.34204006088543189037e-2,
    3.28014464682127739104e-4,
    2.89247864745380683936e-6,
    6.79019408009981274425e-9,
)


def _horner(x: float, coefficients: tuple[float, ...]) -> float:
    """``c[0]·xⁿ + … + c[n]`` by Horner's rule (Cephes ``polevl``)."""
    total = coefficients[0]
    for c in coefficients[1:]:
        total = total * x + c
    return total


def _horner_monic(x: float, coefficients: tuple[float, ...]) -> float:
    """``xⁿ + c[0]·xⁿ⁻¹ + … + c[n−1]`` by Horner's rule (Cephes ``p1evl``)."""
    total = x + coefficients[0]
    for c in coefficients[1:]:
        total = total * x + c
    return total


def normal_quantile(p: float) -> float:
    """Φ⁻¹(p): the x with P[Z ≤ x] = p for Z ~ N(0, 1) (Cephes ``ndtri``, bit for bit).

    ``p = 0`` gives −inf, ``p = 1`` +inf; ``p`` outside [0, 1] (or NaN) is a ``ValueError``.
    """
    y = float(p)
    if not 0.0 <= y <= 1.0:
        raise ValueError(f"p must be in [0, 1], got p={p!r}")
    if y == 0.0:
        return -math.inf
    if y == 1.0:
        return math.inf
    upper = y > 1.0 - _EXP_MINUS_2
    if upper:  # the upper tail, by symmetry
        y = 1.0 - y
    if y > _EXP_MINUS_2:
        w = y - 0.5
        w2 = w * w
        x = w + w * (w2 * _horner(w2, _P0) / _horner_monic(w2, _Q0))
        return x * _SQRT_2PI
    z = math.sqrt(-2.0 * math.log(y))
    head = z - math.log(z) / z
    t = 1.0 / z
    if z < 8.0:
        tail = t * _horner(t, _P1) / _horner_monic(t, _Q1)
    else:
        tail = t * _horner(t, _P2) / _horner_monic(t, _Q2)
    x = head - tail
    return x if upper else -x
