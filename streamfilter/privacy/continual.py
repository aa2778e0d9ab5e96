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
from :func:`streamfilter.privacy.discrete_gaussian_moments.discrete_gaussian_variance`) and a 95% half-width computed
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
from streamfilter.privacy.discrete_gaussian_moments import (
    discrete_gaussian_halfwidth,
    discrete_gaussian_variance,
)
from streamfilter.privacy.noise import (
    RandomBits,
    discrete_gaussian,
)
from streamfilter.privacy.rounding import float_up

__all__ = [
    "MAX_HORIZON",
    "BinaryTreeCounter",
    "CounterExhausted",
    "CounterState",
    "CounterStep",
    "EpochCounter",
    "EpochState",
    "EpochStep",
    "discrete_gaussian_sum_halfwidth",
    "noise_halfwidth",
    "noise_variance",
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


def fft_convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The full linear convolution of two real 1-d arrays, by numpy's real FFT on a power-of-2
    grid (round-off ~1e-16 of the largest term). The half-widths below are integers read off
    the cumulative sums, which round-off moves only at a tie within ~1e-15 of the coverage:
    they equal those computed with ``scipy.signal.fftconvolve`` (tests/privacy/test_continual.py;
    6,531 (s², k, coverage) cases checked when this replaced it), and a run imports no scipy."""
    if len(a) == 1 or len(b) == 1:
        return a * b
    size = len(a) + len(b) - 1
    grid = 1 << (size - 1).bit_length()
    out: np.ndarray = np.fft.irfft(np.fft.rfft(a, grid) * np.fft.rfft(b, grid), grid)[:size]
    return out.copy()


@functools.lru_cache(maxsize=256)
def discrete_gaussian_sum_halfwidth(sigma2_units: int, k: int, coverage: float = 0.95) -> int:
    """Smallest integer h with ``P(|Z_1 + … + Z_k| <= h) >= coverage``, ``Z_j ~ N_Z(0, s²)`` iid.

    ``k = 1`` is :func:`~streamfilter.privacy.discrete_gaussian_moments.discrete_gaussian_halfwidth`. For ``k >= 2``
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
    for _ in range(kk - 1):
        pmf = np.clip(fft_convolve(pmf, one), 0.0, None)
    pmf /= pmf.sum()
    centre = (len(pmf) - 1) // 2
    # P(|X| <= h) = pmf[centre] + 2·Σ_{y=1..h} pmf[centre + y] (symmetric)
    tail = pmf[centre + 1 :] + pmf[centre - 1 :: -1][: len(pmf) - centre - 1]
    covered = pmf[centre] + np.cumsum(tail)
    if pmf[centre] >= coverage:
        return 0
    return int(np.searchsorted(covered, coverage, side="left")) + 1


# --------------------------------------------------------------------------- unbounded horizon


@dataclass(frozen=True)
class EpochState:
    """State of an :class:`EpochCounter`: the current ``epoch`` (1-based), ``carry`` — the sum of
    the *noisy* totals of the completed epochs (public: each is a released root) — and the
    current epoch's tree. ``tree.exact`` is SENSITIVE (stored, never published)."""

    epoch: int
    carry: int
    tree: CounterState

    def to_json_dict(self) -> dict[str, object]:
        return {"epoch": self.epoch, "carry": self.carry, "tree": json.loads(self.tree.to_json())}

    @classmethod
    def from_json_dict(cls, obj: object) -> EpochState:
        if not isinstance(obj, dict) or set(obj) != {"epoch", "carry", "tree"}:
            raise ValueError("epoch counter state must be an object with epoch, carry, tree")
        for key in ("epoch", "carry"):
            if isinstance(obj[key], bool) or not isinstance(obj[key], int):
                raise ValueError(f"epoch counter state {key} must be an integer")
        tree = CounterState.from_json(json.dumps(obj["tree"]))
        return cls(epoch=obj["epoch"], carry=obj["carry"], tree=tree)


@dataclass(frozen=True)
class EpochStep:
    """One step of an :class:`EpochCounter`: the new state, the noisy running total and the
    noise it carries, as ``(s², k)`` pairs — ``k`` independent ``N_Z(0, s²)`` per pair."""

    state: EpochState
    value: int
    noise: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class EpochCounter:
    """Continual counting over an **unbounded** stream (docs/design.md §2.11).

    Epoch ``e = 1, 2, …`` is a :class:`BinaryTreeCounter` over ``first_horizon·2^(e−1)`` steps
    (a power of two) with ``s_e² = ceil(m·L_e/(2ρ))``, ``L_e`` its number of levels. The running
    total is the carry (the noisy roots of the completed epochs: at step ``T_e`` the prefix is the
    root alone) plus the current epoch's noisy prefix — post-processing of the nodes.

    Privacy: an individual who adds 1 to one step of the whole stream lies in exactly one epoch
    and changes ``L_e`` nodes of it by 1: ``L_e/(2s_e²) <= ρ/m`` (CKS 2020, Prop. 5 per node,
    additive over the nodes). ``m`` such counters fed by the same individual therefore cost at
    most ``ρ`` in total, for any number of steps and under adaptive inputs (Feldman & Zrnic,
    Theorem 4.5 with the per-node individual losses); the limit over an infinite run is the
    supremum over its finite prefixes (van Erven & Harremoës 2014, Thm 21).
    """

    first_horizon: int
    counters: int
    rho: float

    def __post_init__(self) -> None:
        h = _check_int("first_horizon", self.first_horizon, 1, MAX_HORIZON)
        if h & (h - 1):
            raise ValueError(f"first_horizon must be a power of two, got {h}")
        _check_int("counters", self.counters, 1, 1 << 10)
        rho = self.rho
        if isinstance(rho, bool) or not isinstance(rho, numbers.Real):
            raise ValueError(f"rho must be a real number, got rho={rho!r}")
        if not (math.isfinite(float(rho)) and float(rho) > 0.0):
            raise ValueError(f"rho must be finite and > 0, got rho={rho!r}")
        self.tree(1)  # refuses a rho too small for the sampler

    def horizon(self, epoch: int) -> int:
        """``T_e = first_horizon·2^(e−1)``."""
        e = _check_int("epoch", epoch, 1, MAX_HORIZON.bit_length())
        h = self.first_horizon << (e - 1)
        if h > MAX_HORIZON:
            raise CounterExhausted(f"epoch {e} would exceed the largest horizon 2^30")
        return h

    def tree(self, epoch: int) -> BinaryTreeCounter:
        """Epoch ``e``'s tree: ``s_e² = ceil(m·L_e/(2ρ))`` so that ``m·L_e/(2s_e²) <= ρ``."""
        h = self.horizon(epoch)
        s2 = math.ceil(Fraction(self.counters * h.bit_length()) / (2 * Fraction(float(self.rho))))
        if s2 > _MAX_SIGMA2_UNITS:
            raise ValueError(f"rho={self.rho!r} is too small: sigma2_units={s2} exceeds 2^62")
        return BinaryTreeCounter(horizon=h, sigma2_units=max(1, s2))

    def rho_per_counter(self) -> Fraction:
        """The largest ``L_e/(2s_e²)`` over every epoch up to the 2^30-step cap, exactly: what
        one individual costs one counter at most (``<= ρ/m`` by the choice of ``s_e²``)."""
        out = Fraction(0)
        for e in range(1, MAX_HORIZON.bit_length() + 1):
            try:
                t = self.tree(e)
            except CounterExhausted:
                break
            out = max(out, Fraction(t.levels, 2 * t.sigma2_units))
        return out

    def initial_state(self) -> EpochState:
        return EpochState(epoch=1, carry=0, tree=self.tree(1).initial_state())

    def check_state(self, state: EpochState) -> None:
        if not isinstance(state, EpochState):
            raise ValueError(f"state must be an EpochState, got {type(state).__name__}")
        tree = self.tree(state.epoch)
        tree.check_state(state.tree)
        if state.tree.t >= tree.horizon:
            raise ValueError("epoch counter state holds a full tree (it rolls over at the end)")

    def noise(self, epoch: int, t: int) -> tuple[tuple[int, int], ...]:
        """The noise in the running total after step ``t`` of epoch ``epoch``: one root per
        completed epoch and ``popcount(t)`` nodes of the current one."""
        done = tuple((self.tree(e).sigma2_units, 1) for e in range(1, epoch))
        return (*done, (self.tree(epoch).sigma2_units, t.bit_count())) if t else done

    def step(self, state: EpochState, count: int, bits: RandomBits) -> EpochStep:
        """Add ``count`` as the next step; checks first, then draws one ``N_Z(0, s_e²)``."""
        self.check_state(state)
        tree = self.tree(state.epoch)
        result = tree.step(state.tree, count, bits)
        value = state.carry + result.value
        noise = self.noise(state.epoch, result.state.t)
        if result.state.t < tree.horizon:
            new = EpochState(state.epoch, state.carry, result.state)
        else:  # the epoch is complete: its prefix is the root alone; carry it, open the next
            new = EpochState(state.epoch + 1, value, self.tree(state.epoch + 1).initial_state())
        return EpochStep(state=new, value=value, noise=noise)

    def to_json_dict(self) -> dict[str, object]:
        return {"first_horizon": self.first_horizon, "counters": self.counters, "rho": self.rho}


def noise_variance(noise: tuple[tuple[int, int], ...]) -> float:
    """Exact variance of a sum of independent discrete Gaussians given as ``(s², k)`` pairs."""
    return sum(k * discrete_gaussian_variance(s2) for s2, k in noise)


@functools.lru_cache(maxsize=1024)
def noise_halfwidth(noise: tuple[tuple[int, int], ...], coverage: float = 0.95) -> int:
    """Smallest integer h with ``P(|X| <= h) >= coverage`` for ``X`` the sum of independent
    discrete Gaussians ``(s², k)`` (``k`` of each). One pair is
    :func:`discrete_gaussian_sum_halfwidth`; several are convolved on a common grid (each pmf
    cut at ``12s + 1``, mass beyond below ``e^-72``), or, past 2^22 grid points, treated as normal
    with the exact variance and rounded up (the discrete and continuous laws then agree far
    below one unit)."""
    parts = tuple((s2, k) for s2, k in noise if k)
    if not parts:
        return 0
    if len(parts) == 1:
        s2, k = parts[0]
        if k <= 64:
            return discrete_gaussian_sum_halfwidth(s2, k, coverage)
    support = sum(k * (2 * (math.ceil(12.0 * math.sqrt(s2)) + 1) + 1) for s2, k in parts)
    if support > _EXACT_SUPPORT_MAX:
        return math.ceil(gaussian_halfwidth(math.sqrt(noise_variance(parts)), coverage))
    pmf = np.ones(1)
    for s2, k in parts:
        m = math.ceil(12.0 * math.sqrt(s2)) + 1
        z = np.arange(-m, m + 1, dtype=np.float64)
        one = np.exp(-(z * z) / (2.0 * s2))
        one /= one.sum()
        for _ in range(k):
            pmf = np.clip(fft_convolve(pmf, one), 0.0, None)
    pmf /= pmf.sum()
    centre = (len(pmf) - 1) // 2
    if pmf[centre] >= coverage:
        return 0
    tail = pmf[centre + 1 :] + pmf[centre - 1 :: -1][: len(pmf) - centre - 1]
    covered = pmf[centre] + np.cumsum(tail)
    return int(np.searchsorted(covered, coverage, side="left")) + 1
