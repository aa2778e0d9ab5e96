"""Continual counting: the binary-tree mechanism with discrete Gaussian noise (pure math).

A stream of non-negative integer counts ``x_1, x_2, …, x_T`` arrives one per step; after step t
the mechanism releases a noisy prefix sum ``Σ_{s≤t} x_s``. The *binary mechanism* (Chan, Shi &
Song 2011, "Private and continual release of statistics"; Dwork, Naor, Pitassi & Rothblum 2010)
keeps one noisy sum per dyadic interval ("node") and releases, after step t, the sum of the
noisy nodes of the binary decomposition of ``[1, t]`` — ``popcount(t)`` nodes.

Implementation (Chan–Shi–Song's ``α``/``α̂`` formulation): per level ``i`` an exact partial sum
``α_i`` and a noisy value ``α̂_i``. At step t let ``i`` be the index of the lowest set bit of t:
``α_i ← Σ_{j<i} α_j + x_t``, ``α_j ← 0`` and ``α̂_j ← 0`` for ``j < i``, and
``α̂_i ← α_i + Z`` with ``Z ~ N_Z(0, s²)`` drawn once. The release is ``Σ_{bit j of t} α̂_j``. Node
``(i, t)`` covers the steps ``(t − 2^i, t]``; one discrete Gaussian is drawn per step.

Privacy (stated for the active-set estimate, where ``x_t`` is "users who left on day t")
------------------------------------------------------------------------------------------
Neighbouring inputs differ by one user, and every user adds 1 to **at most one** ``x_t`` over the
whole horizon (a user leaves the active set at most once). The step ``t`` lies in exactly one
dyadic interval per level, so the user changes at most ``L = T.bit_length()`` node values, each by
exactly 1. Each node is a one-dimensional discrete Gaussian on an integer, which is
``c²/(2s²)``-zCDP for a shift ``c`` (Canonne, Kamath & Steinke 2020, Thm 14/Prop. 5), so the
user's summed individual zCDP over all nodes is at most ``L/(2s²)``; the release is a
post-processing of the nodes.

With *adaptive* inputs (``x_t`` depends on queries chosen from earlier releases) the per-node
cost ``c_v ∈ {0, 1}`` is a function of the user's own data and the earlier outputs, which is the
individual-privacy setting of Feldman & Zrnic (2021): a filter with budget ``L/(2s²)`` never
halts, so Theorem 4.5 / Remark 4.4 give ``ρ = L/(2s²)``-zCDP under fully adaptive composition
(see also Jain, Raskhodnikova, Sivakumar & Smith 2023 on the tree mechanism under adaptive
inputs). :meth:`BinaryTreeCounter.for_rho` picks ``s² = ceil(L/(2ρ))`` so that ``L/(2s²) <= ρ``.

Accuracy: the release at step t has error equal to a sum of ``popcount(t) <= L`` independent
``N_Z(0, s²)`` variables: standard deviation ``sqrt(popcount(t)·Var N_Z(0, s²))`` (exact variance
from :func:`streamfilter.privacy.noise.discrete_gaussian_variance`) and a 95% half-width computed
from the exact distribution of that sum (:func:`discrete_gaussian_sum_halfwidth`).

The counter is an immutable description (:class:`BinaryTreeCounter`) and an immutable state
(:class:`CounterState`); :meth:`BinaryTreeCounter.step` checks its arguments before drawing any
noise and returns a new state, which the caller commits (check, then commit). The state holds
the exact partial sums ``α``: it is as sensitive as the per-user ledger and must never be
published.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from streamfilter.privacy.accuracy import gaussian_halfwidth
from streamfilter.privacy.noise import (
    RandomBits,
    discrete_gaussian,
    discrete_gaussian_halfwidth,
    discrete_gaussian_variance,
)
from streamfilter.privacy.rounding import float_up

__all__ = [
    "MAX_HORIZON",
    "BinaryTreeCounter",
    "CounterExhausted",
    "CounterState",
    "CounterStep",
    "discrete_gaussian_sum_halfwidth",
]

#: Largest horizon accepted (2^30 steps; 31 levels).
MAX_HORIZON = 1 << 30
#: Largest node variance accepted (the discrete Gaussian sampler's own limit).
_MAX_SIGMA2_UNITS = 1 << 62
#: Largest count accepted in one step (keeps every node sum an exact JSON-safe integer).
_MAX_COUNT = 1 << 52
#: Above this many pmf points the half-width uses the normal approximation (see the function).
_EXACT_SUPPORT_MAX = 1 << 22


class CounterExhausted(ValueError):
    """The counter has already released ``horizon`` steps."""


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {name}={value!r}")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {name}={value!r}")
    return int(value)


@dataclass(frozen=True)
class CounterState:
    """After ``t`` steps: exact partial sums ``exact[i]`` (α_i, SENSITIVE) and noisy node values
    ``noisy[i]`` (α̂_i) per level. Immutable; produced by :meth:`BinaryTreeCounter.step`."""

    t: int
    exact: tuple[int, ...]
    noisy: tuple[int, ...]

    def to_json(self) -> str:
        return json.dumps({"t": self.t, "exact": list(self.exact), "noisy": list(self.noisy)})

    @classmethod
    def from_json(cls, text: str | bytes) -> CounterState:
        obj = json.loads(text)
        if not isinstance(obj, dict) or set(obj) != {"t", "exact", "noisy"}:
            raise ValueError("counter state must be an object with keys t, exact, noisy")
        exact, noisy = obj["exact"], obj["noisy"]
        if not (isinstance(exact, list) and isinstance(noisy, list)):
            raise ValueError("counter state exact/noisy must be lists")
        for v in [obj["t"], *exact, *noisy]:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError("counter state values must be integers")
        return cls(t=obj["t"], exact=tuple(exact), noisy=tuple(noisy))


@dataclass(frozen=True)
class CounterStep:
    """One step's result: the new state, the noisy prefix sum and the number of noisy nodes in
    it (``popcount(t)``; the error is a sum of that many independent ``N_Z(0, s²)``)."""

    state: CounterState
    value: int
    nodes: int


@dataclass(frozen=True)
class BinaryTreeCounter:
    """The binary mechanism over ``horizon`` steps with ``N_Z(0, sigma2_units)`` noise per node.

    ``rho`` (``L/(2s²)``, ``L = horizon.bit_length()``) is the zCDP guarantee for inputs in which
    each individual contributes 1 to at most one step (see the module docstring).
    """

    horizon: int
    sigma2_units: int

    def __post_init__(self) -> None:
        _check_int("horizon", self.horizon, 1, MAX_HORIZON)
        _check_int("sigma2_units", self.sigma2_units, 1, _MAX_SIGMA2_UNITS)

    @classmethod
    def for_rho(cls, horizon: int, rho: float) -> BinaryTreeCounter:
        """The counter with the least noise that is ``rho``-zCDP: ``s² = ceil(L/(2ρ))``."""
        h = _check_int("horizon", horizon, 1, MAX_HORIZON)
        if isinstance(rho, bool) or not isinstance(rho, numbers.Real):
            raise ValueError(f"rho must be a real number, got rho={rho!r}")
        if not (math.isfinite(float(rho)) and float(rho) > 0.0):
            raise ValueError(f"rho must be finite and > 0, got rho={rho!r}")
        s2 = math.ceil(Fraction(h.bit_length()) / (2 * Fraction(float(rho))))
        if s2 > _MAX_SIGMA2_UNITS:
            raise ValueError(f"rho={rho!r} is too small: sigma2_units={s2} exceeds 2^62")
        return cls(horizon=h, sigma2_units=max(1, s2))

    @property
    def levels(self) -> int:
        """``L``: the number of nodes on a leaf-to-root path (the per-individual sensitivity²)."""
        return self.horizon.bit_length()

    @property
    def rho(self) -> float:
        """zCDP ``L/(2s²)``, rounded up."""
        return float_up(Fraction(self.levels, 2 * self.sigma2_units))

    def initial_state(self) -> CounterState:
        zeros = (0,) * self.levels
        return CounterState(t=0, exact=zeros, noisy=zeros)

    def check_state(self, state: CounterState) -> None:
        """Raise ``ValueError`` unless ``state`` is a consistent state of this counter."""
        if not isinstance(state, CounterState):
            raise ValueError(f"state must be a CounterState, got {type(state).__name__}")
        _check_int("state.t", state.t, 0, self.horizon)
        if len(state.exact) != self.levels or len(state.noisy) != self.levels:
            raise ValueError(
                f"state has {len(state.exact)}/{len(state.noisy)} levels, counter has {self.levels}"
            )
        # invariant of the α/α̂ recursion: a level whose bit of t is 0 was cleared (or never set)
        for i, (a, n) in enumerate(zip(state.exact, state.noisy, strict=True)):
            if (state.t >> i) & 1 == 0 and (a != 0 or n != 0):
                raise ValueError(f"state level {i} is set but bit {i} of t={state.t} is 0")
            if a < 0:
                raise ValueError(f"state exact[{i}] is negative")

    def check(self, state: CounterState, count: int) -> None:
        """Dry run of :meth:`step`: raises (``CounterExhausted`` / ``ValueError``), draws nothing."""
        self.check_state(state)
        _check_int("count", count, 0, _MAX_COUNT)
        if state.t >= self.horizon:
            raise CounterExhausted(f"the counter has released all horizon={self.horizon} steps")

    def step(self, state: CounterState, count: int, bits: RandomBits) -> CounterStep:
        """Add ``count`` as the next step's input and release the noisy prefix sum.

        Checks first (nothing is drawn if the arguments are invalid or the horizon is used up),
        then draws exactly one ``N_Z(0, s²)`` for the node completed at this step.
        """
        self.check(state, count)
        t = state.t + 1
        i = (t & -t).bit_length() - 1  # the level of the node that completes at step t
        exact = list(state.exact)
        noisy = list(state.noisy)
        exact[i] = sum(exact[:i]) + int(count)
        for j in range(i):
            exact[j] = 0
            noisy[j] = 0
        z = int(discrete_gaussian(bits, self.sigma2_units, 1)[0])
        noisy[i] = exact[i] + z
        value = sum(noisy[j] for j in range(self.levels) if (t >> j) & 1)
        new = CounterState(t=t, exact=tuple(exact), noisy=tuple(noisy))
        return CounterStep(state=new, value=value, nodes=t.bit_count())

    # -- accuracy of the release at step t ---------------------------------------------------
    def variance(self, t: int) -> float:
        """Exact variance of the release error at step ``t``: ``popcount(t)·Var N_Z(0, s²)``."""
        k = _check_int("t", t, 1, self.horizon).bit_count()
        return k * discrete_gaussian_variance(self.sigma2_units)

    def sigma(self, t: int) -> float:
        return math.sqrt(self.variance(t))

    def halfwidth(self, t: int, coverage: float = 0.95) -> int:
        """Smallest integer h with ``P(|error| <= h) >= coverage`` at step ``t``."""
        k = _check_int("t", t, 1, self.horizon).bit_count()
        return discrete_gaussian_sum_halfwidth(self.sigma2_units, k, coverage)

    def to_json_dict(self) -> dict[str, int]:
        return {"horizon": self.horizon, "sigma2_units": self.sigma2_units}


@functools.lru_cache(maxsize=256)
def discrete_gaussian_sum_halfwidth(sigma2_units: int, k: int, coverage: float = 0.95) -> int:
    """Smallest integer h with ``P(|Z_1 + … + Z_k| <= h) >= coverage``, ``Z_j ~ N_Z(0, s²)`` iid.

    ``k = 1`` is :func:`~streamfilter.privacy.noise.discrete_gaussian_halfwidth`. For ``k >= 2``
    the pmf of one ``Z`` is tabulated on ``|z| <= M`` with ``M = ceil(12·s) + 1`` (the mass beyond
    is below ``e^-72``) and convolved k-fold (FFT; float round-off ~1e-15, far below the steps of
    the cumulative distribution near the 95% point). When the table would exceed 2^22 points
    (``s`` beyond ~1.7e5/k) the sum is treated as normal with the exact variance, rounded up to
    an integer: at that scale the discrete and continuous Gaussians agree far below one unit.
    """
    s2 = _check_int("sigma2_units", sigma2_units, 1, _MAX_SIGMA2_UNITS)
    kk = _check_int("k", k, 1, 64)
    if not 0.0 < coverage < 1.0:
        raise ValueError(f"coverage must be in (0, 1), got coverage={coverage!r}")
    if kk == 1:
        return discrete_gaussian_halfwidth(s2, coverage)
    m = math.ceil(12.0 * math.sqrt(s2)) + 1
    if (2 * m + 1) * kk > _EXACT_SUPPORT_MAX:
        return math.ceil(
            gaussian_halfwidth(math.sqrt(kk * discrete_gaussian_variance(s2)), coverage)
        )
    z = np.arange(-m, m + 1, dtype=np.float64)
    one = np.exp(-(z * z) / (2.0 * s2))
    one /= one.sum()
    pmf = one
    import scipy.signal  # lazy: only the discrete-Gaussian interval needs a convolution

    for _ in range(kk - 1):
        pmf = np.clip(scipy.signal.fftconvolve(pmf, one), 0.0, None)
    pmf /= pmf.sum()
    centre = (len(pmf) - 1) // 2
    # P(|X| <= h) = pmf[centre] + 2·Σ_{y=1..h} pmf[centre + y] (symmetric)
    tail = pmf[centre + 1 :] + pmf[centre - 1 :: -1][: len(pmf) - centre - 1]
    covered = pmf[centre] + np.cumsum(tail)
    if pmf[centre] >= coverage:
        return 0
    return int(np.searchsorted(covered, coverage, side="left")) + 1
